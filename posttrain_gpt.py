"""Fine-tune a GPT model (Qwen3, Llama, ...) with Megatron's own training loop: MindSpeed-LLM's entry.

    torchrun --nproc_per_node N posttrain_gpt.py <Megatron-LM arguments> \\
        --stage sft --is-instruction-dataset --prompt-type qwen3 --finetune --load <base> \\
        [--lora-r 16 --lora-alpha 32 --lora-target-modules linear_qkv linear_proj linear_fc1 linear_fc2]

    torchrun --nproc_per_node N posttrain_gpt.py <Megatron-LM arguments> \\
        --stage dpo --is-pairwise-dataset --prompt-type qwen3 --finetune --load <sft model> \\
        [--dpo-loss-type sigmoid|hinge|ipo --dpo-beta 0.1 --dpo-label-smoothing 0 --pref-ftx 0 --ref-model DIR]
        [--precompute-ref-logps FILE | --ref-logps FILE]

``--stage sft`` (the default here) uses ``pretrain_gpt.py``'s model provider, forward step and dataset
provider: a fine-tuning run is a training run whose data are conversations (``--is-instruction-dataset``:
datasets from ``tools/preprocess_data.py --handler-name ...InstructionHandler``, the loss on assistant
turns only; or Megatron's ``--sft`` JSONL conversations) and, with LoRA, whose trainable parameters are
the adapters.

``--stage dpo`` trains on preference pairs (``--is-pairwise-dataset``: ``...PairwiseHandler`` datasets)
with this file's forward step: each micro-batch of b pairs is one forward pass over 2b rows (chosen
rows, then rejected rows). Before each step's policy pass a frozen reference
(:mod:`adaptor.preference.reference`) runs over the same micro-batches through Megatron's schedule
(:mod:`adaptor.preference.reference_pass`), so its values reach the last pipeline stage, where the loss
is DPO's (:mod:`adaptor.preference.losses`). With context parallelism each rank holds a share of every
row and the rows' log-probabilities are added over the context-parallel group. With
``--ref-logps`` the reference's sequence log-probabilities are read from a file instead, by each pair's
index in the dataset, and no reference model is built; ``--precompute-ref-logps`` writes that file from
the run's own reference (:mod:`adaptor.preference.stored_reference`). The
rewards reach the log line and TensorBoard through Megatron's loss dict (:mod:`adaptor.preference.metrics`).
Other MindSpeed-LLM stages are refused in one line.
"""
import contextlib
import sys

import adaptor  # noqa: F401  (first: patches megatron for this machine)

from functools import partial

import torch

from megatron.core import mpu
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.training import get_args, get_timers, print_rank_0
from megatron.core.utils import get_batch_on_this_cp_rank
from megatron.training.utils import is_first_or_last_pipeline_stage

from adaptor.finetune.batches import cut_after_last_loss, variable_lengths
from adaptor.preference.losses import averages_logps, dpo_loss, sequence_logps
from adaptor.preference.metrics import dpo_report
from adaptor.preference.pairwise_dataset import KEYS, PAIR_INDEX, PairwiseDataset, PairwiseLowLevel, rows_of_pairs
from adaptor.preference.reference import FrozenReference, adapters_disabled, checkpoint_loader
from adaptor.preference.reference_pass import VALUES, ReferencePass
from adaptor.preference import stored_reference
from pretrain_gpt import broadcast_from_tp_rank_0, gpt_dataset_config, is_dataset_built_on_rank, main, model_provider

PAIR_DTYPES = {"tokens": torch.int64, "labels": torch.int64, "loss_mask": torch.float32, "position_ids": torch.int64}
_reference: FrozenReference | None = None
_stored: torch.Tensor | None = None  # --ref-logps: [pairs, 4] float64, stored_reference.COLUMNS
_recorder: stored_reference.Recorder | None = None  # --precompute-ref-logps


def _default_stage(argv: list[str]) -> list[str]:
    """``--stage sft`` unless the command line names a stage (MindSpeed-LLM's scripts always do)."""
    if any(a == "--stage" or a.startswith("--stage=") for a in argv):
        return argv
    return [*argv, "--stage", "sft"]


def get_pair_batch(data_iterator):
    """(tokens, labels, loss_mask, position_ids), each [2b, s]: the b chosen rows, then the b rejected
    rows, and the pairs' dataset indices [b]. Read on TP rank 0 and broadcast over the TP group; a pipeline
    stage between the first and the last reads nothing (None)."""
    args = get_args()
    if not is_first_or_last_pipeline_stage(None):
        return (None,) * len(KEYS), None
    raw = next(data_iterator) if mpu.get_tensor_model_parallel_rank() == 0 else {}
    shape = (args.micro_batch_size, 2, args.seq_length)
    rows = tuple(rows_of_pairs(broadcast_from_tp_rank_0(raw.get(k), shape, PAIR_DTYPES[k])) for k in KEYS)
    pairs = broadcast_from_tp_rank_0(raw.get(PAIR_INDEX), (args.micro_batch_size,), torch.int64)
    batch = dict(zip(KEYS, rows))
    if variable_lengths(args):  # one pipeline stage (validated): no fixed shape to exchange
        batch = cut_after_last_loss(batch, args)
    if args.context_parallel_size > 1:  # this rank's share of every row's positions
        batch = get_batch_on_this_cp_rank(batch, is_hybrid_cp=False, cp_group=mpu.get_context_parallel_group())
    return tuple(batch[k] for k in KEYS), pairs


def row_logps(token_logps, loss_mask, average=False):
    """Each row's summed (or mean) log-probability; with context parallelism, over every rank's share."""
    group = mpu.get_context_parallel_group() if mpu.get_context_parallel_world_size() > 1 else None
    return sequence_logps(token_logps, loss_mask, average, group=group)


def reference_forward_step(data_iterator, model):
    """The reference pass's forward step: the same rows through the reference, no graph."""
    (tokens, labels, loss_mask, position_ids), pairs = get_pair_batch(data_iterator)
    output = model(tokens, position_ids, None, labels=labels)
    return output, partial(reference_loss_func, loss_mask, pairs)


def reference_loss_func(loss_mask, pairs, output_tensor):
    """The reference's sequence log-probabilities [2b], handed back through the schedule's reduced items
    (and recorded for --precompute-ref-logps); the loss itself is zero."""
    token_logps = -output_tensor.float()
    if _recorder is not None:
        b = pairs.numel()
        sums = row_logps(token_logps, loss_mask).double()
        means = row_logps(token_logps, loss_mask, average=True).double()
        rows = torch.stack([sums[:b], sums[b:], means[:b], means[b:]], dim=1)
        first = mpu.get_tensor_model_parallel_rank() == 0 and mpu.get_context_parallel_rank() == 0
        written = _recorder.record(pairs.cpu().numpy(), rows.cpu().numpy()) if first else None
        if written:
            print(f"> wrote the reference's log-probabilities of {len(_recorder.values)} pairs to {written}",
                  flush=True)
    values = row_logps(token_logps, loss_mask, averages_logps(get_args().dpo_loss_type))
    count = torch.tensor(pairs.numel(), dtype=torch.int, device=values.device)
    return values.sum() * 0, count, {VALUES: values}


def reference_logps(pairs):
    """The reference's sequence log-probabilities [2b] (chosen rows, then rejected rows) of the policy's
    current micro-batch: read from --ref-logps, or the reference pass's next values."""
    if _stored is None:
        return dpo_forward_step.reference_pass.pop()
    row = _stored[pairs.cpu()]
    picked = row[:, 2:] if averages_logps(get_args().dpo_loss_type) else row[:, :2]
    return picked.t().reshape(-1).to(device=pairs.device, dtype=torch.float32)


@contextlib.contextmanager
def reference_models(policy):
    """The model chunks the reference pass runs: the frozen copy, or with LoRA the policy with its
    adapters off."""
    if getattr(get_args(), "lora_r", None):
        with contextlib.ExitStack() as stack:
            for chunk in policy:
                stack.enter_context(adapters_disabled(chunk))
            yield policy
    else:
        yield [_reference.get(chunk) for chunk in policy]


def dpo_loss_func(loss_mask, pairs, output_tensor):
    """The micro-batch's summed DPO loss, its number of pairs (Megatron divides by it) and the report."""
    args = get_args()
    pairs_count = loss_mask.shape[0] // 2
    reference = reference_logps(pairs)
    average = averages_logps(args.dpo_loss_type)
    policy = row_logps(-output_tensor.float(), loss_mask, average)
    losses, chosen, rejected = dpo_loss(policy[:pairs_count], policy[pairs_count:], reference[:pairs_count],
                                        reference[pairs_count:], args.dpo_beta, args.dpo_loss_type,
                                        args.dpo_label_smoothing)
    sft = None
    total = losses
    if args.pref_ftx:
        sft = -row_logps(-output_tensor[:pairs_count].float(), loss_mask[:pairs_count], average=True)
        total = losses + args.pref_ftx * sft
    count = torch.tensor(pairs_count, dtype=torch.int, device=losses.device)
    return total.sum(), count, dpo_report(losses, chosen, rejected, sft)


def dpo_forward_step(data_iterator, model):
    timers = get_timers()
    timers("batch-generator", log_level=2).start()
    (tokens, labels, loss_mask, position_ids), pairs = get_pair_batch(data_iterator)
    timers("batch-generator").stop()
    output = model(tokens, position_ids, None, labels=labels)
    return output, partial(dpo_loss_func, loss_mask, pairs)


dpo_forward_step.rows_per_sample = reference_forward_step.rows_per_sample = 2  # chosen and rejected


def pairwise_datasets_provider(train_val_test_num_samples, vp_stage=None):
    """Pairwise datasets (--is-pairwise-dataset) over --data-path blends."""
    args = get_args()
    print_rank_0("> building train, validation, and test datasets (PairwiseDataset) ...")
    datasets = BlendedMegatronDatasetBuilder(
        PairwiseDataset, train_val_test_num_samples, partial(is_dataset_built_on_rank, vp_stage=vp_stage),
        gpt_dataset_config(args),
    ).build()
    return tuple(None if ds is not None and len(ds) == 0 and not owed else ds
                 for ds, owed in zip(datasets, train_val_test_num_samples))


pairwise_datasets_provider.is_distributed = True


def build_reference(config):
    """A model of the policy's layout (this pipeline stage's share), wrapped as Megatron wraps the policy
    for --fp16/--bf16."""
    args = get_args()
    module = model_provider(pre_process=mpu.is_pipeline_first_stage(), post_process=mpu.is_pipeline_last_stage(),
                            config=config)
    if args.fp16 or args.bf16:
        from megatron.core.transformer.module import Float16Module

        module = Float16Module(config, module)
    return module


def choose_steps(args):
    """DPO's forward step and dataset provider for ``--stage dpo``; None (pretrain_gpt.py's) otherwise."""
    global _reference, _stored, _recorder
    if args.stage != "dpo":
        return None
    dpo_forward_step.reference_pass = None
    if args.ref_logps:
        _stored = torch.from_numpy(stored_reference.read(args.ref_logps)[1].copy())
        return dpo_forward_step, pairwise_datasets_provider
    elif args.precompute_ref_logps:
        low = PairwiseLowLevel(args.data_path[-1])
        header = stored_reference.header_for(low, args.seq_length)
        _recorder = stored_reference.Recorder(args.precompute_ref_logps, header)
    loader = checkpoint_loader(args.ref_model, args.refer_model_iter) if args.ref_model else None
    _reference = FrozenReference(build_reference, loader)
    dpo_forward_step.reference_pass = ReferencePass(reference_forward_step, reference_models)
    return dpo_forward_step, pairwise_datasets_provider


if __name__ == "__main__":
    sys.argv[1:] = _default_stage(sys.argv[1:])
    main(choose_steps)
