"""Compare Megatron's logits with transformers' for a Hugging Face directory, at any TP/PP/EP layout.

    python tools/check_hf_parity.py --hf-dir /models/Qwen3-0.6B --tp 2 --pp 2
    python tools/check_hf_parity.py --hf-dir tiny_dsv3 --model-type deepseek3 --tp 2 --pp 2 --ep 2
    python tools/check_hf_parity.py --hf-dir /models/Qwen3-0.6B --lora-dir my_adapter --tp 2
    python tools/check_hf_parity.py --hf-dir /models/Qwen3-0.6B --pp 2 --vpp 2
    python tools/check_hf_parity.py --hf-dir /models/Qwen2.5-VL-3B-Instruct --tp 2 --pp 2
    python tools/check_hf_parity.py --hf-dir qwen2_5_vl_dir --also-hf-dir qwen3_vl_dir --pp 2

One fixed random batch, fp32, twice: transformers (``AutoModelForCausalLM``, eager attention) here,
and Megatron's GPTModel (``pretrain_gpt.model_provider``, flags from
``adaptor.convert.megatron_args_from_hf_config``, loaded as ``--hf-load-dir`` loads) under torchrun
(``ADAPTOR_BACKEND``, default cpu/gloo), logits gathered over TP, padding stripped. ``--lora-dir``
adds a PEFT adapter on both sides (``peft.PeftModel``, ``adaptor.convert.online.load_peft_adapter``).
Qwen2.5-VL and Qwen3-VL directories run a batch with images (tools/vl_parity.py): transformers'
``AutoModelForImageTextToText`` against pretrain_mm.py's model of a model.json naming the directory.
``--also-hf-dir`` checks further Qwen-VL directories in the same Megatron processes, one model after the
other at the same layout: torchrun, megatron's imports and process groups are paid once.

Prints the max abs logit difference (a line per directory) and exits 1 past ``--tolerance``; bad input is one line
``check_hf_parity.py: error: ...`` and exit 2.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROG = "check_hf_parity.py"
MODEL_TYPES = {"qwen3": "qwen3", "deepseek_v3": "deepseek3", "llama": "llama2", "qwen2": "qwen2",
               "qwen3_moe": "qwen3-moe", "mixtral": "mixtral", "qwen2_5_vl": "qwen2_5_vl", "qwen3_vl": "qwen3_vl"}
VL = ("qwen2_5_vl", "qwen3_vl")


def error(message: str, code: int = 2):
    print(f"{PROG}: error: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf-dir", required=True, help="Hugging Face directory (config.json + safetensors)")
    parser.add_argument("--model-type", choices=sorted(set(MODEL_TYPES.values())), default=None,
                        help="default: from config.json's model_type")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size")
    parser.add_argument("--pp", type=int, default=1, help="pipeline parallel size")
    parser.add_argument("--vpp", type=int, default=1,
                        help="virtual pipeline stages per pipeline rank (interleaved schedule; needs --pp 2 or more)")
    parser.add_argument("--ep", type=int, default=1, help="expert parallel size (expert tensor parallel 1 when > 1)")
    parser.add_argument("--also-hf-dir", action="append", default=[], metavar="DIR",
                        help="another Qwen-VL directory checked in the same processes (repeatable)")
    parser.add_argument("--lora-dir", default=None, help="a PEFT LoRA adapter directory to add on both sides")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="bound on the max abs logit difference")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1234, help="seed of the random token batch")
    parser.add_argument("--timeout", type=int, default=900, help="seconds for the Megatron run")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def layout_world_size(tp: int, pp: int, ep: int) -> int:
    """Processes for TP x PP with enough data-parallel ranks to hold EP (expert tensor parallel 1)."""
    dp = ep // math.gcd(ep, tp)
    return tp * pp * dp


def vocab_size(config: dict) -> int:
    return int(config.get("vocab_size") or config["text_config"]["vocab_size"])


def megatron_flags(model_type: str, config: dict, opts, flags: list[str] | None = None) -> list[str]:
    """The run's flags: the model's (``flags``, or those of config.json) and the layout's."""
    from adaptor.convert import padded_vocab_size
    from adaptor.convert.config_check import model_flags

    flags = model_flags(model_type, config) if flags is None else flags
    world = layout_world_size(opts.tp, opts.pp, opts.ep)
    dp = world // (opts.tp * opts.pp)
    vocab = vocab_size(config)
    drop = {"--vocab-size", "--seq-length", "--max-position-embeddings", "--micro-batch-size",
            "--global-batch-size", "--tokenizer-type", "--padded-vocab-size", "--make-vocab-size-divisible-by"}
    kept, skip = [], False
    for i, flag in enumerate(flags):  # drop the flags set below, with their values
        if skip:
            skip = False
            continue
        if flag in drop:
            skip = i + 1 < len(flags) and not flags[i + 1].startswith("--")
            continue
        kept.append(flag)
    max_pos = max(opts.seq_len, int({**config, **config.get("text_config", {})}.get("max_position_embeddings")
                                    or opts.seq_len))
    kept += [
        "--tensor-model-parallel-size", str(opts.tp), "--pipeline-model-parallel-size", str(opts.pp),
        "--expert-model-parallel-size", str(opts.ep),
        "--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab),
        "--padded-vocab-size", str(padded_vocab_size(vocab, opts.tp)),
        "--seq-length", str(opts.seq_len), "--max-position-embeddings", str(max_pos),
        "--micro-batch-size", str(opts.batch), "--global-batch-size", str(opts.batch * dp),
        "--attention-dropout", "0", "--hidden-dropout", "0", "--mock-data", "--train-iters", "1",
        "--lr", "0", "--eval-iters", "0", "--seed", "1234",
    ]
    if opts.ep > 1:
        kept += ["--expert-tensor-parallel-size", "1"]
    if opts.vpp > 1:  # as MindSpeed-LLM's scripts give it: layers per virtual stage
        layers = int(config["num_hidden_layers"]) // (opts.pp * opts.vpp)
        kept += ["--num-layers-per-virtual-pipeline-stage", str(layers)]
    return kept


def hf_logits(hf_dir: str, tokens, lora_dir: str | None = None):
    """transformers' logits, and with `lora_dir` also those with peft's adapter: (base, adapted or None)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        base = model(input_ids=tokens).logits.float()
    if lora_dir is None:
        return base, None
    from peft import PeftModel

    adapted = PeftModel.from_pretrained(model, lora_dir).eval()
    with torch.no_grad():
        return base, adapted(input_ids=tokens).logits.float()


def lora_flags(lora_dir: str) -> list[str]:
    """The LoRA flags that build the adapter of `lora_dir` (ConversionError for one Megatron cannot hold)."""
    from adaptor.convert.lora import PeftAdapter

    adapter = PeftAdapter(lora_dir)
    alpha = adapter.alpha
    return ["--lora-r", str(adapter.r), "--lora-alpha", str(int(alpha) if alpha.is_integer() else alpha),
            "--lora-dropout", "0", "--lora-target-modules", *adapter.linears()]


def run_megatron(spec: dict, nproc: int, timeout: int) -> str:
    from adaptor.env import torchrun_command
    from adaptor.rendezvous import rendezvous_port

    cmd = [*torchrun_command(), f"--nproc_per_node={nproc}",
           f"--master_port={rendezvous_port()}", str(Path(__file__).resolve()), "--hf-dir", spec["models"][0]["hf_dir"],
           "--worker", spec["spec_file"]]
    env = dict(os.environ, PYTHONUNBUFFERED="1", ADAPTOR_QUIET="1")
    env.setdefault("ADAPTOR_BACKEND", "cpu")
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        lines = [line for line in output.splitlines() if line.strip()]
        reason = next((line for line in lines if ": error: " in line),
                      next((line for line in lines if line.startswith("[rank") and "Error" in line),
                           lines[-1] if lines else ""))
        sys.stderr.write("\n".join(lines[-40:]) + "\n")
        error(f"the Megatron run failed (exit {proc.returncode}): {reason}")
    return output


def main(argv=None) -> int:
    opts = parse_args(argv)
    if opts.worker:
        return worker(opts.worker)
    if opts.lora_dir is not None and not (Path(opts.lora_dir) / "adapter_config.json").is_file():
        error(f"--lora-dir {opts.lora_dir}: no adapter_config.json there (not a PEFT adapter directory)")
    for name in ("tp", "pp", "ep", "vpp", "seq_len", "batch"):
        if getattr(opts, name) < 1:
            error(f"--{name.replace('_', '-')} must be at least 1")
    if opts.vpp > 1 and opts.pp < 2:
        error(f"--vpp {opts.vpp} needs --pp 2 or more")
    os.environ.setdefault("ADAPTOR_QUIET", "1")
    import torch

    work = tempfile.TemporaryDirectory(prefix="hf_parity_")
    with work:
        models = [prepare(opts, "--hf-dir", opts.hf_dir, Path(work.name))]
        for i, extra in enumerate(opts.also_hf_dir, 1):
            models.append(prepare(opts, "--also-hf-dir", extra, Path(work.name) / str(i)))
        if opts.also_hf_dir and any(m["model_json"] is None for m in models):
            error("--also-hf-dir checks Qwen-VL directories only (and --hf-dir must be one too)")
        nproc = layout_world_size(opts.tp, opts.pp, opts.ep)
        spec = {"models": models, "spec_file": str(Path(work.name) / "spec.json")}
        Path(spec["spec_file"]).write_text(json.dumps(spec))
        run_megatron(spec, nproc, opts.timeout)
        worst = max(report(opts, model, torch.load(model["logits"]), nproc) for model in models)
    return 0 if worst <= opts.tolerance else 1


def prepare(opts, flag: str, directory: str, folder: Path) -> dict:
    """One directory's part of the worker's spec (its flags, model.json, input batch saved under ``folder``)."""
    import torch

    from adaptor.convert import ConversionError, HfCheckpoint, Layout, model_mapping

    hf_dir = Path(directory)
    if not (hf_dir / "config.json").is_file():
        error(f"{flag} {directory}: no config.json there")
    config = json.loads((hf_dir / "config.json").read_text())
    model_type = opts.model_type or MODEL_TYPES.get(config.get("model_type"))
    if model_type is None:
        error(f"{flag} {directory}: model_type {config.get('model_type')!r} is not supported; "
              f"pass --model-type {'|'.join(dict.fromkeys(MODEL_TYPES.values()))}")
    folder.mkdir(parents=True, exist_ok=True)
    try:
        HfCheckpoint(str(hf_dir)).names()
        etp = 1 if opts.ep > 1 else None
        layout = Layout(opts.tp, opts.pp, opts.ep, etp, opts.vpp)
        model_json = None
        if model_type in VL:
            if opts.lora_dir is not None or opts.vpp > 1 or opts.ep > 1:
                error(f"{flag} {directory}: {model_type} runs without --lora-dir, --vpp and --ep")
            from adaptor.mm.qwen_vl.text_weights import text_mapping
            from vl_parity import decoder_flags, write_model_json

            text_mapping(config).check_layout(layout)
            model_json = write_model_json(str(hf_dir), str(folder))
            flags = megatron_flags(model_type, config, opts, decoder_flags(model_json))
        else:
            model_mapping(model_type, config).check_layout(layout)
            flags = megatron_flags(model_type, config, opts)
        if opts.lora_dir is not None:
            flags += lora_flags(opts.lora_dir)
    except ConversionError as exc:
        message = str(exc)
        for converter_flag, ours in (("--target-tensor-parallel-size", "--tp"),
                                     ("--target-pipeline-parallel-size", "--pp"),
                                     ("--target-expert-parallel-size", "--ep")):
            message = message.replace(converter_flag, ours)
        message = message.replace(" virtual stages", " (--vpp)")
        lora = opts.lora_dir and opts.lora_dir in message
        where = f"--lora-dir {opts.lora_dir}" if lora else f"{flag} {directory}"
        error(f"{where}: {message}")
    vocab = vocab_size(config)
    generator = torch.Generator().manual_seed(opts.seed)
    if model_json is not None:
        from vl_parity import make_batch

        try:
            inputs = make_batch(config, opts.batch, opts.seq_len, generator)
        except ValueError as exc:
            error(str(exc))
    else:
        inputs = torch.randint(0, vocab, (opts.batch, opts.seq_len), generator=generator)
    tokens = str(folder / "tokens.pt")
    torch.save(inputs, tokens)
    from adaptor.convert import padded_vocab_size

    return {"hf_dir": str(hf_dir.resolve()), "given": directory, "model_type": model_type, "flags": flags,
            "vocab": vocab, "padded_vocab": padded_vocab_size(vocab, opts.tp), "tokens": tokens,
            "logits": str(folder / "logits.pt"), "model_json": model_json,
            "lora_dir": str(Path(opts.lora_dir).resolve()) if opts.lora_dir else None}


def report(opts, model: dict, megatron, nproc: int) -> float:
    """Prints one directory's verdict line; returns its max abs logit difference."""
    import torch

    inputs = torch.load(model["tokens"])
    if model["model_json"] is not None:
        from vl_parity import hf_logits as vl_hf_logits

        base, adapted = vl_hf_logits(model["hf_dir"], inputs), None
    else:
        base, adapted = hf_logits(model["hf_dir"], inputs, opts.lora_dir)
    reference = base if adapted is None else adapted
    if megatron.shape != reference.shape:
        error(f"logits shapes differ: Megatron {tuple(megatron.shape)}, transformers {tuple(reference.shape)}")
    diff = (megatron - reference).abs().max().item()
    scale = reference.abs().max().item()
    layout = f"tp={opts.tp} pp={opts.pp}{f' vpp={opts.vpp}' if opts.vpp > 1 else ''} ep={opts.ep} ({nproc} processes)"
    if adapted is not None:
        layout += f" with LoRA {opts.lora_dir} (moves logits by up to {(adapted - base).abs().max().item():.3e})"
    verdict = "ok" if diff <= opts.tolerance else "FAILED"
    print(f"{PROG}: {model['model_type']} {model['given']} {layout}: max abs logit difference {diff:.3e} "
          f"(max |logit| {scale:.3e}, tolerance {opts.tolerance:g}, batch {opts.batch}x{opts.seq_len}): {verdict}",
          flush=True)
    return diff


# ----------------------------------------------------------------------------- torchrun worker
def worker(spec_file: str) -> int:
    spec = json.loads(Path(spec_file).read_text())
    first = spec["models"][0]
    sys.argv = [sys.argv[0]] + first["flags"]
    sys.path.insert(0, str(ROOT))
    from adaptor.bootstrap import setup

    setup()  # patches megatron for this backend, from these flags

    import torch
    from megatron.training import get_args
    from megatron.training.arguments import parse_and_validate_args
    from megatron.training.initialize import initialize_megatron

    parse_and_validate_args(args_defaults={"tokenizer_type": "NullTokenizer"})
    initialize_megatron()
    for i, model in enumerate(spec["models"]):
        # A further directory (the same layout, other model flags) gets its own arguments; the processes,
        # their groups and the patches stay those of the first.
        args = get_args() if i == 0 else model_args(model)
        logits = model_logits(model, args)
        if logits is not None:
            torch.save(logits, model["logits"])
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


def model_args(model: dict):
    """Megatron's arguments for ``model``'s flags, parsed and validated as the first model's were."""
    from megatron.training.arguments import parse_args, validate_args

    sys.argv = [sys.argv[0]] + model["flags"]
    args = parse_args()
    validate_args(args, {"tokenizer_type": "NullTokenizer"})
    args.padded_vocab_size = model["padded_vocab"]  # the first model's came with its tokenizer
    return args


def model_logits(spec: dict, args):
    """``spec``'s logits on the last stage's first TP and DP rank (vocabulary padding stripped), else None."""
    import torch
    from megatron.core import mpu, tensor_parallel
    from megatron.core.enums import ModelType
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.training.training import get_model

    from adaptor.convert import ConversionError
    from adaptor.errors import fail
    from adaptor.convert.online import load_hf_weights
    from pretrain_gpt import model_provider

    vl = spec.get("model_json") is not None
    if vl:  # built and loaded (init_from_hf_path) as pretrain_mm.py does
        from vl_parity import model_provider_for

        model = get_model(model_provider_for(spec["model_json"], args), ModelType.encoder_or_decoder,
                          wrap_with_ddp=False)
    else:
        args.hf_load_dir, args.model_type_hf = spec["hf_dir"], spec["model_type"]
        model = get_model(model_provider, ModelType.encoder_or_decoder, wrap_with_ddp=False)
        try:
            load_hf_weights(model, args)
        except ConversionError as exc:
            fail(f"--hf-dir {spec['hf_dir']}: {exc}")
    if spec.get("lora_dir"):
        from adaptor.convert.online import load_peft_adapter

        try:
            load_peft_adapter(model, args, spec["lora_dir"])
        except ConversionError as exc:
            fail(f"--lora-dir {spec['lora_dir']}: {exc}")
    for chunk in model:
        chunk.eval()
    device = next(model[0].parameters()).device
    inputs = torch.load(spec["tokens"])
    if vl:  # read on TP rank 0 and sent over the TP group, as pretrain_mm.py's batches are
        from adaptor.mm.qwen_vl.steps import broadcast_batch

        batch = {**inputs, "labels": inputs["tokens"], "loss_mask": torch.ones(inputs["tokens"].shape)}
        inputs = broadcast_batch(batch if mpu.get_tensor_model_parallel_rank() == 0 else None)
        tokens, position_ids, attention_mask = inputs["tokens"], inputs["position_ids"], None
    else:
        tokens = inputs.to(device)
    batch, seq = tokens.shape
    if not vl:
        position_ids = torch.arange(seq, device=device).unsqueeze(0).expand(batch, -1)
        attention_mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=device), diagonal=1)[None, None]

    def forward_step(data_iterator, chunk):
        if vl:
            output = chunk(tokens, position_ids, inputs["pixel_values"], inputs["image_grid_thw"])
        else:
            output = chunk(tokens, position_ids, attention_mask)
        return output, lambda out, non_loss_data=False: out

    # The interleaved schedule (virtual stages) runs at least PP micro-batches: the same batch each time.
    microbatches = mpu.get_pipeline_model_parallel_world_size() if len(model) > 1 else 1
    with torch.no_grad():
        collected = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=[iter([None] * microbatches) for _ in model]
            if len(model) > 1 else iter([None]), model=model, num_microbatches=microbatches,
            seq_length=seq, micro_batch_size=batch, forward_only=True, collect_non_loss_data=True)
    if mpu.is_pipeline_last_stage():
        logits = tensor_parallel.gather_from_tensor_model_parallel_region(collected[0])
        if mpu.get_tensor_model_parallel_rank() == 0 and mpu.get_data_parallel_rank() == 0:
            return logits[..., : spec["vocab"]].float().cpu()
    return None


if __name__ == "__main__":
    sys.exit(main())
