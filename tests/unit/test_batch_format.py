"""One answer to "what does the batch give attention": :func:`adaptor.batch_format.batch_format`.

``EXPECTED`` is the decision per combination of the arguments that matter, written down as data:
fine-tuning data first (conversation boundaries, THD only for the adaptor's core attention on one
pipeline stage), then pretraining without Transformer Engine (inter-document masking always THD;
``--reset-attention-mask`` THD with --use-flash-attn or CP on one stage), then Transformer Engine
(nothing packed). The function must give it for every combination, and the places that act on it
must agree: the layer-spec swaps, the dataloader's mask default, and ``pretrain_gpt.get_batch``
(run for real in a child process, one rank) on both the pretraining and the fine-tuning paths.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from adaptor.batch_format import Boundaries, batch_format
from helpers.prefetch import prefetched
from helpers.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
ANY = object()
CONV, DOCS, EOD, NONE = Boundaries.CONVERSATIONS, Boundaries.DOCUMENTS, Boundaries.EOD, Boundaries.NONE

# (data, transformer_engine, pp, use_flash_attn, cp, reset_attention_mask, inter_document) -> (boundaries, thd);
# the first row that matches decides.
EXPECTED = [
    (("finetune", True, ANY, ANY, ANY, ANY, ANY), (CONV, False)),
    (("finetune", False, 2, ANY, ANY, ANY, ANY), (CONV, False)),
    (("finetune", False, 1, True, ANY, ANY, ANY), (CONV, True)),
    (("finetune", False, 1, ANY, 2, ANY, ANY), (CONV, True)),
    (("finetune", ANY, ANY, ANY, ANY, ANY, ANY), (CONV, False)),
    (("pretrain", False, ANY, ANY, ANY, ANY, True), (DOCS, True)),
    (("pretrain", False, 1, True, ANY, True, False), (EOD, True)),
    (("pretrain", False, 1, ANY, 2, True, False), (EOD, True)),
    (("pretrain", ANY, ANY, ANY, ANY, True, False), (EOD, False)),  # the dataset's dense mask
    # Transformer Engine with inter-document masking: no cu_seqlens taken, and Megatron builds no mask
    (("pretrain", ANY, ANY, ANY, ANY, ANY, ANY), (NONE, False)),
]
# The expected FlashAttention swap, as flags: on where any of these is (one exception, test_swap_gates_agree).
FLASH_GATES = ("use_flash_attn", "context_parallel_size>1", "dataloader_inter_document_masking")

DATA = {"pretrain": {}, "sft": {"sft": True}, "instruction": {"is_instruction_dataset": True}}


def args_of(data, te, pp, flash, cp, reset, inter) -> Namespace:
    values = dict(transformer_impl="transformer_engine" if te else "local", pipeline_model_parallel_size=pp,
                  use_flash_attn=flash, context_parallel_size=cp, reset_attention_mask=reset,
                  dataloader_inter_document_masking=inter, sft=False, is_instruction_dataset=False,
                  create_attention_mask_in_dataloader=True)
    return Namespace(**{**values, **DATA[data]})


def expected(data, *rest):
    key = ("pretrain" if data == "pretrain" else "finetune", *rest)
    return next(out for row, out in EXPECTED if all(r is ANY or r == k for r, k in zip(row, key)))


COMBOS = list(itertools.product(DATA, (False, True), (1, 2), (False, True), (1, 2), (False, True), (False, True)))


@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: "-".join(map(str, c)))
def test_batch_format_is_the_table(combo):
    fmt = batch_format(args_of(*combo))
    assert (fmt.boundaries, fmt.thd) == expected(*combo)
    assert fmt.reads_cu_seqlens == (fmt.boundaries in (DOCS, CONV))
    assert fmt.finetuning == (combo[0] != "pretrain")


def test_a_partial_namespace_is_a_run_without_boundaries():
    """Gates read library users' and tests' namespaces too: what is missing is off."""
    fmt = batch_format(Namespace())
    assert (fmt.boundaries, fmt.thd) == (NONE, False)


@pytest.fixture(scope="module")
def features():
    from adaptor import bootstrap

    return list(bootstrap.all_features())


def test_swap_gates_agree(features):
    """The local spec runs the adaptor's attention wherever attention takes THD, and swaps as before
    everywhere else except one case: fine-tuning with --dataloader-inter-document-masking but neither
    --use-flash-attn nor CP gives attention a dense conversation mask, which megatron-core's attention
    now applies (the adaptor's attention applied the same mask)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from adaptor.layer_specs import module_swaps, row_is_on
    from adaptor.ops.flash_attention import FlashAttention

    for combo in COMBOS:
        data, te, pp, flash, cp, reset, inter = combo
        if te:
            continue  # the Transformer Engine spec is used as it is
        args = args_of(*combo)
        fmt = batch_format(args)
        swapped = module_swaps(args, features).get(DotProductAttention) is FlashAttention
        assert row_is_on(args, "batch_format.thd") == fmt.thd, combo
        assert swapped or not fmt.thd, combo
        before = any(row_is_on(args, gate) for gate in FLASH_GATES)
        changed = data != "pretrain" and inter and not flash and cp == 1
        assert swapped == (before and not changed), combo


def test_inter_document_masking_with_transformer_engine_is_refused(features):
    """Transformer Engine's attention would get no boundaries from this get_batch: one line, not a run
    that silently attends across documents."""
    from adaptor.features import ArgumentError

    packed = next(f for f in features if f.name == "packed_sequences")
    args = Namespace(transformer_impl="transformer_engine", dataloader_inter_document_masking=True,
                     pipeline_model_parallel_size=1, reset_attention_mask=False, context_parallel_size=1)
    with pytest.raises(ArgumentError, match="--transformer-impl local"):
        packed.validate(args, None)
    args.dataloader_inter_document_masking = False
    packed.validate(args, None)


def test_dataloader_mask_default_agrees(features):
    """Attention that takes THD never reads the dense mask, so the dataloader builds none; CP turns it
    off too. Otherwise the command line's choice stands."""
    by_name = {f.name: f for f in features}
    for combo in COMBOS:
        args = args_of(*combo)
        for name in ("context_parallel", "packed_sequences"):
            by_name[name].set_defaults(args, None)
        cp_off = not combo[1] and combo[4] > 1
        assert args.create_attention_mask_in_dataloader == (not (batch_format(args).thd or cp_off)), combo


CHILD = r"""
import itertools, json, os, sys
import adaptor
import torch
import torch.distributed as dist
sys.argv = ["pretrain_gpt.py", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"]
from megatron.core import parallel_state as ps
from megatron.training import global_vars
from megatron.training.arguments import parse_args
from adaptor.finetune.instruction_dataset import dense_mask_from_cu_seqlens
import pretrain_gpt
from patches.long_context.context_parallel import ContextParallel
from patches.long_context.packed_sequences import PackedSequences

dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % os.environ["PORT"], rank=0, world_size=1)
ps.initialize_model_parallel(1)
args = parse_args()
args.rank = 0
args.micro_batch_size, args.seq_length = 2, 16
global_vars.set_args(args)
eod = global_vars.rebuild_tokenizer(args).eod
S = args.seq_length
tokens = torch.arange(2 * S).reshape(2, S) % 50
tokens[0, 4] = eod                                    # EOD: documents of 5 + 11 and 16
cu = torch.full((2, S + 1), S, dtype=torch.int32)     # cu_seqlens: 8 + 8 and 3 + 13
cu[0, :3] = torch.tensor([0, 8, 16])
cu[1, :3] = torch.tensor([0, 3, 16])
dataset_mask = torch.rand(2, 1, S, S, generator=torch.Generator().manual_seed(1)) > 0.5
for te, data, flash, reset, inter in itertools.product((False, True), ("pretrain", "sft", "instruction"),
                                                      (False, True), (False, True), (False, True)):
    args.transformer_impl = "transformer_engine" if te else "local"
    args.use_flash_attn, args.reset_attention_mask, args.dataloader_inter_document_masking = flash, reset, inter
    args.sft, args.is_instruction_dataset = data == "sft", data == "instruction"
    args.create_attention_mask_in_dataloader = True
    for feature in (ContextParallel(), PackedSequences()):
        feature.set_defaults(args, None)
    if inter:  # as Megatron's validate_args: the dataset builds no mask then
        args.create_attention_mask_in_dataloader = False
    raw = {"tokens": tokens, "labels": tokens, "loss_mask": torch.ones(2, S), "position_ids": torch.arange(S).repeat(2, 1)}
    if data != "pretrain" or inter:
        raw["cu_seqlens"] = cu
    if data == "instruction":
        raw["num_tokens"] = torch.tensor([S, S])
    if data == "pretrain" and args.create_attention_mask_in_dataloader:
        raw["attention_mask"] = dataset_mask
    out = pretrain_gpt.get_batch(iter([raw]))
    mask, params = out[3], out[5]
    if mask is None:
        given = None
    elif torch.equal(mask, dataset_mask):
        given = "dataset"
    elif torch.equal(mask, dense_mask_from_cu_seqlens(cu, S)):
        given = "conversations"
    else:
        given = "other"
    print("CASE " + json.dumps({"combo": [data, te, 1, flash, 1, reset, inter], "mask": given,
                                "cu_seqlens": None if params is None else params.cu_seqlens_q.tolist()}), flush=True)
"""


@prefetched
def get_batch_cases():
    environ = dict(os.environ, ADAPTOR_QUIET="1", ADAPTOR_BACKEND="cpu", PORT=str(free_port()))
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", CHILD], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line[5:]) for line in proc.stdout.splitlines() if line.startswith("CASE ")]


def test_get_batch_takes_the_path_batch_format_names(get_batch_cases):
    """One rank, one pipeline stage: packed from the named source where THD, else the named dense mask."""
    packed = {EOD: [0, 5, 16, 32], DOCS: [0, 8, 16, 19, 32], CONV: [0, 8, 16, 19, 32]}
    assert len(get_batch_cases) == 48
    for case in get_batch_cases:
        combo = tuple(case["combo"])
        fmt = batch_format(args_of(*combo))
        if fmt.thd:
            assert (case["cu_seqlens"], case["mask"]) == (packed[fmt.boundaries], None), combo
        elif fmt.finetuning:
            assert (case["cu_seqlens"], case["mask"]) == (None, "conversations"), combo
        else:  # the dataset's mask as it came, where the dataloader builds one
            mask_built = not combo[6]
            assert (case["cu_seqlens"], case["mask"]) == (None, "dataset" if mask_built else None), combo
