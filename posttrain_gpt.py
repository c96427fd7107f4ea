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
index in the dataset, and no reference model is built; ``--precompute-ref-logps`` computes that file
before the first step (:mod:`adaptor.preference.precompute`: the reference over every pair, on the
starting policy itself where that is the reference) and trains against it
(:mod:`adaptor.preference.stored_reference`). The
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
from megatron.training import get_args, get_timers, get_tokenizer, print_rank_0
from megatron.core.utils import get_attr_wrapped_model, get_batch_on_this_cp_rank
from megatron.training.utils import is_first_or_last_pipeline_stage

from adaptor.batch_format import batch_format
from adaptor.finetune.batches import MODEL_KEYS, cut_after_last_loss, finetune_rows, variable_lengths
from adaptor.finetune.instruction_dataset import pad_id
from adaptor.log import every_rank
from adaptor.preference.losses import averages_logps, dpo_loss, sequence_logps
from adaptor.preference.metrics import dpo_report
from adaptor.preference.pairwise_dataset import (PAIR_INDEX, PAIR_SLOT, PairwiseDataset, PairwiseLowLevel, max_pairs,
                                                 rows_of_pairs)
from adaptor.preference.reference import FrozenReference, adapters_disabled, checkpoint_loader
from adaptor.preference.reference_pass import VALUES, ReferencePass
from adaptor.preference import precompute, stored_reference
from pretrain_gpt import broadcast_from_tp_rank_0, gpt_dataset_config, is_dataset_built_on_rank, main, model_provider

PAIR_DTYPES = {"tokens": torch.int64, "labels": torch.int64, "loss_mask": torch.float32, "position_ids": torch.int64,
               PAIR_SLOT: torch.int64}
_reference: FrozenReference | None = None
_stored: torch.Tensor | None = None  # --ref-logps: [pairs, 4] float64, stored_reference.COLUMNS
_recorder: stored_reference.Recorder | None = None  # --precompute-ref-logps


def _default_stage(argv: list[str]) -> list[str]:
    """``--stage sft`` unless the command line names a stage (MindSpeed-LLM's scripts always do)."""
    if any(a == "--stage" or a.startswith("--stage=") for a in argv):
        return argv
    return [*argv, "--stage", "sft"]


class PairBatch:
    """A DPO micro-batch on this rank: the model's inputs (``MODEL_KEYS``), each token's sequence
    (``slots``: chosen sequences first, then the rejected ones, ``num_slots`` in all) and the pairs'
    dataset indices (``pairs`` [num_slots / 2], -1 where a slot holds no pair)."""

    def __init__(self, rows: dict, pairs: torch.Tensor) -> None:
        self.inputs = {k: rows.get(k) for k in MODEL_KEYS}
        self.slots = rows.get(PAIR_SLOT)
        self.pairs = pairs.reshape(-1)
        self.num_slots = 2 * self.pairs.numel()
        self.valid = self.pairs >= 0
        self.count = int(self.valid.sum())

    def logps(self, token_logps: torch.Tensor, average: bool = False):
        """(chosen, rejected) [count] sequence log-probabilities; with context parallelism, over every
        rank's share of the sequences' tokens."""
        group = mpu.get_context_parallel_group() if mpu.get_context_parallel_world_size() > 1 else None
        sums = sequence_logps(token_logps, self.inputs["loss_mask"], average, group=group, slots=self.slots,
                              num_slots=self.num_slots)
        half = self.num_slots // 2
        return sums[:half][self.valid], sums[half:][self.valid]

    def model_outputs(self, model):
        x = self.inputs
        return model(x["tokens"], x["position_ids"], x["attention_mask"], labels=x["labels"],
                     packed_seq_params=x["packed_seq_params"])


def get_pair_batch(data_iterator, vp_stage=None):
    """This micro-batch's :class:`PairBatch`: [2b, s] rows, the b chosen rows then the b rejected rows,
    read on TP rank 0 and broadcast over the TP group; a pipeline stage between the first and the last
    reads nothing (None); with virtual pipeline stages, a model chunk between the first and the last.

    Unpacked rows (one pair each) need only the causal mask. Rows packing several pairs, and every row
    where attention takes THD, go through the fine-tuning batch (:func:`adaptor.finetune.batches.finetune_rows`):
    a dense mask causal inside each pair's sequence, or one THD stream with the sequences' boundaries."""
    args = get_args()
    if not is_first_or_last_pipeline_stage(vp_stage):
        return None
    raw = next(data_iterator) if mpu.get_tensor_model_parallel_rank() == 0 else {}
    b, s, m = args.micro_batch_size, args.seq_length, max_pairs(args.seq_length)
    rows = {k: rows_of_pairs(broadcast_from_tp_rank_0(raw.get(k), (b, 2, s), PAIR_DTYPES[k])) for k in PAIR_DTYPES}
    pairs = broadcast_from_tp_rank_0(raw.get(PAIR_INDEX), (b, m), torch.int64)
    # row r's pair k is sequence r * m + k: chosen sequences in [0, b m), rejected ones in [b m, 2 b m)
    rows[PAIR_SLOT] = rows[PAIR_SLOT] + m * torch.arange(2 * b, device=rows[PAIR_SLOT].device)[:, None]
    packed = bool((pairs[:, 1:] >= 0).any())  # the same on every TP rank: pairs were broadcast
    if packed or batch_format(args).thd:  # only these read the sequences' boundaries
        cu_seqlens = rows_of_pairs(broadcast_from_tp_rank_0(raw.get("cu_seqlens"), (b, 2, s + 1), torch.int32))
        num_tokens = rows_of_pairs(broadcast_from_tp_rank_0(raw.get("num_tokens"), (b, 2), torch.int64))
        rows = finetune_rows(rows, cu_seqlens, num_tokens, args, cp_rank=mpu.get_context_parallel_rank(),
                             cp_group=mpu.get_context_parallel_group(), carry=(PAIR_SLOT,))
        return PairBatch(rows, pairs)
    if variable_lengths(args):  # one pipeline stage (validated): no fixed shape to exchange
        rows = cut_after_last_loss(rows, args)
    if args.context_parallel_size > 1:  # this rank's share of every row's positions
        rows = get_batch_on_this_cp_rank(rows, is_hybrid_cp=False, cp_group=mpu.get_context_parallel_group())
    return PairBatch(rows, pairs)


def reference_forward_step(data_iterator, model):
    """The reference pass's forward step: the same rows through the reference, no graph."""
    batch = get_pair_batch(data_iterator, get_attr_wrapped_model(model, "vp_stage"))
    output = batch.model_outputs(model) if batch is not None else model(None, None, None)
    return output, partial(reference_loss_func, batch)


def reference_loss_func(batch, output_tensor):
    """The reference's sequence log-probabilities [2 pairs] (chosen, then rejected), handed back through the
    schedule's reduced items (and recorded for --precompute-ref-logps); the loss itself is zero."""
    token_logps = -output_tensor.float()
    average = averages_logps(get_args().dpo_loss_type)
    if _recorder is not None:
        sums, means = batch.logps(token_logps), batch.logps(token_logps, average=True)
        rows = torch.stack([sums[0], sums[1], means[0], means[1]], dim=1).double()
        _recorder.record(batch.pairs[batch.valid].cpu().numpy(), rows.cpu().numpy())
        values = torch.cat(means if average else sums)
    else:
        values = torch.cat(batch.logps(token_logps, average))
    count = torch.tensor(batch.count, dtype=torch.int, device=values.device)
    return values.sum() * 0, count, {VALUES: values}


def reference_logps(batch):
    """The reference's sequence log-probabilities (chosen, rejected) [pairs] of the policy's current
    micro-batch: read from --ref-logps, or the reference pass's next values."""
    if _stored is None:
        values = dpo_forward_step.reference_pass.pop()
    else:
        row = _stored[batch.pairs[batch.valid].cpu()]
        picked = row[:, 2:] if averages_logps(get_args().dpo_loss_type) else row[:, :2]
        values = picked.t().reshape(-1).to(device=batch.pairs.device, dtype=torch.float32)
    return values[:batch.count], values[batch.count:]


@contextlib.contextmanager
def starting_policy(policy):
    """The policy's chunks in eval mode: before its first step they are the reference."""
    modes = [chunk.training for chunk in policy]
    for chunk in policy:
        chunk.eval()
    try:
        yield policy
    finally:
        for chunk, mode in zip(policy, modes):
            chunk.train(mode)


def precompute_reference(low, schedule, kwargs):
    """--precompute-ref-logps, before the first step: the reference over every pair (on the policy itself
    when the reference is its starting model), written to the file; the run then reads the values as a
    --ref-logps run does and keeps no reference model."""
    global _stored, _recorder
    args = get_args()
    batches = precompute.micro_batches(low, args.seq_length, pad_id(get_tokenizer()), args.micro_batch_size,
                                       mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size())
    policy = kwargs["model"]
    own = not (args.ref_model or getattr(args, "lora_r", None))
    with torch.no_grad(), (starting_policy(policy) if own else reference_models(policy)) as models:
        precompute.run(schedule, kwargs, reference_forward_step, models, batches)
    _reference.release()  # a --ref-model copy is not needed any more
    if mpu.is_pipeline_last_stage():
        values = precompute.gather(_recorder.values, mpu.get_data_parallel_group())
        _stored = torch.from_numpy(values)
        first = (mpu.get_data_parallel_rank() == 0 and mpu.get_tensor_model_parallel_rank() == 0
                 and mpu.get_context_parallel_rank() == 0)
        if first:
            stored_reference.write(_recorder.path, _recorder.header, values)
            every_rank(f"--precompute-ref-logps: the reference's log-probabilities of {len(values)} pairs, computed "
                       f"before the first step on {'the starting policy itself' if own else 'the reference model'}, "
                       f"written to {_recorder.path}; training reads them")
    _recorder = None
    dpo_forward_step.reference_pass = None


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
        yield _reference.get(policy)


def dpo_loss_func(batch, output_tensor):
    """The micro-batch's summed DPO loss, its number of pairs (Megatron divides by it) and the report."""
    args = get_args()
    reference_chosen, reference_rejected = reference_logps(batch)
    token_logps = -output_tensor.float()
    chosen, rejected = batch.logps(token_logps, averages_logps(args.dpo_loss_type))
    losses, chosen_rewards, rejected_rewards = dpo_loss(chosen, rejected, reference_chosen, reference_rejected,
                                                        args.dpo_beta, args.dpo_loss_type, args.dpo_label_smoothing)
    sft = None
    total = losses
    if args.pref_ftx:
        sft = -batch.logps(token_logps, average=True)[0]
        total = losses + args.pref_ftx * sft
    count = torch.tensor(batch.count, dtype=torch.int, device=losses.device)
    return total.sum(), count, dpo_report(losses, chosen_rewards, rejected_rewards, sft)


def dpo_forward_step(data_iterator, model):
    timers = get_timers()
    timers("batch-generator", log_level=2).start()
    batch = get_pair_batch(data_iterator, get_attr_wrapped_model(model, "vp_stage"))
    timers("batch-generator").stop()
    output = batch.model_outputs(model) if batch is not None else model(None, None, None)
    return output, partial(dpo_loss_func, batch)


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


def build_reference(config, vp_stage=None):
    """A model chunk of the policy's layout (this pipeline stage's share; with virtual pipeline stages,
    chunk ``vp_stage``), wrapped as Megatron wraps the policy for --fp16/--bf16."""
    args = get_args()
    ignore_virtual = vp_stage is None
    module = model_provider(pre_process=mpu.is_pipeline_first_stage(ignore_virtual, vp_stage),
                            post_process=mpu.is_pipeline_last_stage(ignore_virtual, vp_stage), vp_stage=vp_stage,
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
    loader = checkpoint_loader(args.ref_model, args.refer_model_iter) if args.ref_model else None
    _reference = FrozenReference(build_reference, loader)
    first = None
    if args.precompute_ref_logps:
        low = PairwiseLowLevel(args.data_path[-1])
        header = stored_reference.header_for(low, args.seq_length)
        _recorder = stored_reference.Recorder(args.precompute_ref_logps, header)
        first = partial(precompute_reference, low)
    dpo_forward_step.reference_pass = ReferencePass(reference_forward_step, reference_models, first)
    return dpo_forward_step, pairwise_datasets_provider


if __name__ == "__main__":
    sys.argv[1:] = _default_stage(sys.argv[1:])
    main(choose_steps)
