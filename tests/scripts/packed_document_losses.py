"""Per-document losses of a packed batch against the same documents run one by one.

    python tests/scripts/packed_document_losses.py PORT {rope,yarn,linear}

Builds the tiny Qwen3 (megatron-core GPTModel, local spec with the adaptor's core attention) on
one gloo process, packs documents of uneven lengths into one THD stream with
``adaptor.packed_sequences.pack`` (boundaries reach attention and RoPE through PackedSeqParams),
and runs each document alone (causal, no packing). Prints one JSON line: the largest per-token
loss difference, the largest parameter-gradient difference (sum of packed losses against the
sum over documents), and a control (the packed stream run WITHOUT boundaries), which must differ.
"""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("ADAPTOR_BACKEND", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import adaptor  # noqa: E402,F401  (first: patches megatron for this backend)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state as ps  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: E402
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed  # noqa: E402
from megatron.core.transformer.dot_product_attention import DotProductAttention  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from adaptor.layer_specs import swap_modules  # noqa: E402
from adaptor.ops.flash_attention import FlashAttention  # noqa: E402
from adaptor.packed_sequences import pack  # noqa: E402

DOCS = (5, 17, 9, 1, 32)  # uneven, one of a single token, one as long as the rest together
VOCAB = 128


def build(rope: str) -> GPTModel:
    config = TransformerConfig(num_layers=2, hidden_size=64, ffn_hidden_size=192, num_attention_heads=4,
                               num_query_groups=2, kv_channels=32, qk_layernorm=True, normalization="RMSNorm",
                               gated_linear_unit=True, activation_func=torch.nn.functional.silu,
                               add_bias_linear=False, attention_dropout=0.0, hidden_dropout=0.0,
                               masked_softmax_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False)
    spec = swap_modules(get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm"),
                        {DotProductAttention: FlashAttention})
    kwargs = dict(position_embedding_type="rope", rotary_base=1000000)
    if rope == "yarn":
        kwargs = dict(position_embedding_type="yarn", rotary_base=1000000)
        # GPTModel reads these from the config (the command line's --rotary-scaling-factor etc.); mscale
        # 0.707 gives attention the YaRN temperature, so the scaling is visible in the scores.
        for field, value in dict(yarn_rotary_scaling_factor=4.0, yarn_original_max_position_embeddings=16,
                                 yarn_beta_fast=32.0, yarn_beta_slow=1.0, yarn_mscale=0.707, yarn_mscale_all_dim=0.0,
                                 yarn_correction_range_round_to_int=True).items():
            setattr(config, field, value)
    elif rope == "linear":
        kwargs["seq_len_interpolation_factor"] = 4.0
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=128,
                    share_embeddings_and_output_weights=True, **kwargs)


def main():
    port, rope = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    ps.initialize_model_parallel(1)
    model_parallel_cuda_manual_seed(1234)
    torch.manual_seed(1234)
    model = build(rope)
    g = torch.Generator().manual_seed(9)
    docs = [torch.randint(0, VOCAB, (n,), generator=g) for n in DOCS]
    labels = [torch.randint(0, VOCAB, (n,), generator=g) for n in DOCS]

    def grads():
        out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return out

    # One by one: each document is a sequence of its own, causal.
    alone = []
    for tokens, lab in zip(docs, labels):
        pos = torch.arange(tokens.numel())[None]
        loss = model(tokens[None], pos, None, labels=lab[None])
        loss.sum().backward()
        alone.append(loss.detach()[0])
    grads_alone = grads()

    # Packed: one stream, the boundaries in PackedSeqParams.
    stream = torch.cat(docs)[None]
    batch = {"tokens": stream, "labels": torch.cat(labels)[None],
             "loss_mask": torch.ones_like(stream, dtype=torch.float),
             "position_ids": torch.cat([torch.arange(n) for n in DOCS])[None]}
    packed = pack(batch, [list(DOCS)])
    loss = model(packed.tokens, packed.position_ids, None, labels=packed.labels, packed_seq_params=packed.params)
    loss.sum().backward()
    grads_packed = grads()
    per_doc = torch.split(loss.detach()[0], list(DOCS))

    # Control: the stream without boundaries (one causal sequence) gives other losses after document 1.
    control = model(stream, torch.arange(stream.size(1))[None], None, labels=batch["labels"]).detach()[0]

    result = {
        "rope": rope,
        "max_loss_diff": max((a - b).abs().max().item() for a, b in zip(per_doc, alone)),
        "max_grad_diff": max((grads_packed[n] - grads_alone[n]).abs().max().item() for n in grads_alone),
        "grad_scale": max(grads_alone[n].abs().max().item() for n in grads_alone),
        "control_diff": (control - torch.cat(alone)).abs().max().item(),
        "mean_loss": torch.cat(alone).mean().item(),
    }
    print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
