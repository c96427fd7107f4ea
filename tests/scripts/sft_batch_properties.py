"""What a fine-tuning batch lets the loss see, on the real model and the real instruction dataset.

    torchrun --nproc_per_node 1 tests/scripts/sft_batch_properties.py <Megatron arguments with
        --is-instruction-dataset --data-path PREFIX>

Builds ``pretrain_gpt.py``'s model and the run's ``InstructionDataset``, takes the first sample that
packs several conversations, and prints one JSON line:

* ``prompt_label_grad_diff``: the largest gradient difference after every label outside the loss
  mask (prompt tokens, padding, the last token of each conversation) is replaced by a random token
  id; 0.0 when prompt labels cannot reach the loss;
* ``packed_vs_alone``: the largest difference between the packed sample's per-token losses and the
  same conversations' losses each run as a sample of its own;
* ``control``: the same packed tokens with one causal sequence and no boundaries (must differ);
* ``conversations``, ``loss_tokens``: what was compared.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import adaptor  # noqa: E402,F401  (first: patches megatron for this backend)

import torch  # noqa: E402
from torch.utils.data import default_collate  # noqa: E402


def main():
    from megatron.core.enums import ModelType
    from megatron.training import get_args
    from megatron.training.arguments import parse_and_validate_args
    from megatron.training.initialize import initialize_megatron
    from megatron.training.training import get_model

    from adaptor.finetune.batches import finetune_batch
    from adaptor.finetune.instruction_dataset import InstructionLowLevel, build_sample
    from adaptor.lm_loss import masked_lm_loss
    import pretrain_gpt

    parse_and_validate_args(args_defaults={"tokenizer_type": "HuggingFaceTokenizer"})
    initialize_megatron()
    args = get_args()
    args.check_for_nan_in_loss_and_grad = False  # the rerun state machine checks only inside Megatron's loop
    (model,) = get_model(pretrain_gpt.model_provider, ModelType.encoder_or_decoder, wrap_with_ddp=False)
    data = InstructionLowLevel(args.data_path[0])
    seq = args.seq_length
    for doc in range(len(data)):
        ids, labels, seg = data.sample(doc)
        if seg[:seq + 1].max() >= 2 and len(ids) <= seq + 1:
            break
    else:
        raise SystemExit("no sample of two or more conversations in the dataset")

    def batch_of(*samples):
        return default_collate(list(samples))

    def losses(batch, boundaries=True):
        b = {k: batch[k].clone() for k in ("tokens", "labels", "loss_mask", "position_ids")}
        cu = batch["cu_seqlens"]
        if not boundaries:  # one causal sequence per row
            cu = torch.full_like(cu, seq)
            cu[:, 0] = 0
            b["position_ids"] = torch.arange(seq).expand_as(b["tokens"]).contiguous()
        tokens, lab, mask, attn, pos, packed = finetune_batch(b, cu, batch["num_tokens"], args)
        out = model(tokens, pos, attn, labels=lab, loss_mask=mask, packed_seq_params=packed)
        return out, mask

    def grads_of(batch):
        out, mask = losses(batch)
        loss, count, _ = masked_lm_loss(mask, out)
        (loss / count).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return grads

    sample = build_sample(ids, labels, seg, seq, 0)
    packed = batch_of(sample)
    reference = grads_of(packed)
    perturbed = {k: v.clone() for k, v in packed.items()}
    outside = perturbed["loss_mask"] == 0
    g = torch.Generator().manual_seed(7)
    random_ids = torch.randint(0, args.padded_vocab_size, perturbed["labels"].shape, generator=g)
    perturbed["labels"] = torch.where(outside, random_ids, perturbed["labels"])
    changed = int((perturbed["labels"] != packed["labels"]).sum())
    again = grads_of(perturbed)
    moved = reference.keys() | again.keys()
    grad_diff = max((reference[n] - again[n]).abs().max().item() for n in moved)

    with torch.no_grad():
        per_token, mask = losses(packed)
        per_token = per_token.reshape(-1)[: int(sample["num_tokens"])]
        control, _ = losses(packed, boundaries=False)
        control = control.reshape(-1)[: int(sample["num_tokens"])]
        # each conversation alone: its own sample, starting at position 0
        alone = []
        n = min(len(ids), seq + 1)
        bounds = [0] + [i for i in range(1, n) if seg[i] != seg[i - 1]] + [n]
        for a, b in zip(bounds[:-1], bounds[1:]):
            one = build_sample(ids[a:b], labels[a:b], seg[a:b], seq, 0)
            out, _ = losses(batch_of(one))
            alone.append(out.reshape(-1)[: b - a - 1])
        # the packed row's position p predicts token p+1; a conversation's last position predicts the
        # next conversation's first token, which the mask leaves out: compare the rest
        keep = torch.ones(n - 1, dtype=torch.bool)
        keep[[b - 1 for b in bounds[1:-1]]] = False
        alone_cat = torch.cat(alone)
        loss_positions = mask.reshape(-1)[: n - 1].bool()
    result = {
        "conversations": len(bounds) - 1,
        "loss_tokens": int(loss_positions.sum()),
        "labels_changed": changed,
        "prompt_label_grad_diff": grad_diff,
        "packed_vs_alone": (per_token[keep] - alone_cat).abs().max().item(),
        "control": (control[keep] - alone_cat).abs().max().item(),
        "path": "thd" if args.use_flash_attn else "dense",
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
