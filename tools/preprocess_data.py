"""Tokenize raw text into Megatron indexed datasets (``{prefix}_{key}_document.bin/.idx``).

    python tools/preprocess_data.py --input data/ --output-prefix out/corpus \\
        --tokenizer-type HuggingFaceTokenizer --tokenizer-model examples/data/tokenizer \\
        --append-eod --workers 2

Megatron-LM's argument names. The tokenizer is built exactly as training builds it (``import adaptor``,
Megatron's ``_add_tokenizer_args`` and ``build_tokenizer``), so every Megatron tokenizer type works;
batches are encoded at once when the tokenizer offers ``encode_batch`` (adaptor/tokenizer_json.py).
Input formats: tools/text_readers.py; output: tools/indexed_writer.py, renamed into place only when
complete, streamed a few ``--batch-size`` chunks at a time. Every problem is one line
``preprocess_data.py: error: ...`` and a non-zero exit, leaving an existing dataset untouched.

Instruction (chat) datasets, with MindSpeed-LLM's names: ``--handler-name
AlpacaStyleInstructionHandler|SharegptStyleInstructionHandler --prompt-type qwen3 [--enable-thinking
false] [--map-keys JSON] [--pack --seq-length N]`` renders records with the chat template
(tools/chat_template.py), keeps the loss on assistant turns and writes
``{prefix}_packed_{input_ids,labels,attention_mask}_document.bin/.idx`` and
``{prefix}_packed_meta.json`` (docs/data.md#instruction-datasets). The pairwise handlers
(``AlpacaStylePairwiseHandler|SharegptStylePairwiseHandler``, tools/pairwise_data.py) write preference
pairs for DPO: ``{prefix}_packed_{chosen,rejected}_{input_ids,labels}_document.bin/.idx``.
"""
from __future__ import annotations

import argparse
import importlib.util
import collections
import itertools
import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from indexed_writer import IndexedDatasetWriter, remove_stale_temps, temp_path  # noqa: E402
from text_readers import (  # noqa: E402
    MAX_REPORTED_BAD, InputError, file_format, iter_chunks, parquet_available, parse_chunk, resolve_inputs,
)
import chat_template  # noqa: E402
import instruction_data  # noqa: E402
import pairwise_data  # noqa: E402

PROG = "preprocess_data.py"
DTYPE_LIMITS = {"uint16": 1 << 16, "int32": 1 << 31}
MAX_QUOTED_BAD = 10  # skipped lines quoted on stderr; the rest are only counted


class ToolError(Exception):
    """Ends the run with ``preprocess_data.py: error: <message>``."""


class Interrupted(BaseException):
    """SIGTERM/SIGHUP: clean up like on any error, then exit 128+signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# Arguments -----------------------------------------------------------------------------------

def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def add_tool_args(parser: argparse.ArgumentParser, required: bool = True) -> argparse.ArgumentParser:
    group = parser.add_argument_group("input data")
    group.add_argument("--input", nargs="+", metavar="PATH", required=required,
                       help="file(s), glob(s) (quote them) or directory(ies). Formats by extension: "
                            ".jsonl/.json/.ndjson (one JSON object per line), .parquet (needs pyarrow), "
                            "anything else plain text; .gz/.bz2/.xz are decompressed. A directory "
                            "contributes its data files, recursively, in sorted order.")
    group.add_argument("--json-keys", nargs="+", default=["text"], metavar="KEY",
                       help="keys (parquet: columns) to tokenize, one output dataset each. Plain text "
                            "takes one key, which only names the output. Default: text")
    group.add_argument("--text-document-per", choices=("line", "file"), default="line",
                       help="plain text: one document per line (default) or per file")
    group.add_argument("--skip-bad-lines", action="store_true",
                       help="skip (and count) malformed JSON lines, lines missing a key and "
                            "bytes that are not UTF-8, instead of stopping")
    group = parser.add_argument_group("output data")
    group.add_argument("--output-prefix", metavar="PREFIX", required=required,
                       help="writes PREFIX_{key}_document.bin/.idx; the directory must exist")
    group.add_argument("--dtype", choices=("auto", "uint16", "int32"), default="auto",
                       help="token id type in the .bin. auto (default): Megatron's choice, uint16 "
                            "for vocabularies under 65500 tokens, else int32")
    group.add_argument("--append-eod", action="store_true",
                       help="append the tokenizer's end-of-document token to every document")
    group = parser.add_argument_group(
        "instruction data", "conversations for supervised fine-tuning, MindSpeed-LLM's handlers and names; "
        "writes PREFIX_packed_{input_ids,labels,attention_mask}_document.bin/.idx and PREFIX_packed_meta.json")
    group.add_argument("--handler-name", metavar="HANDLER",
                       help="AlpacaStyleInstructionHandler (instruction/input/output, optional system and "
                            "history) or SharegptStyleInstructionHandler (conversations of from/value turns, or "
                            "OpenAI-style messages of role/content). Without it the tool writes pretraining text "
                            "(MindSpeed-LLM's GeneralPretrainHandler). AlpacaStylePairwiseHandler / "
                            "SharegptStylePairwiseHandler: preference pairs (chosen and rejected responses) for DPO")
    group.add_argument("--prompt-type", metavar="TYPE",
                       help="the chat format: qwen3, qwen (Qwen2.5's ChatML), chatml, deepseek3, llama3. The "
                            "tokenizer's own chat template renders conversations when it has one (it must write "
                            "this type's turn markers); otherwise a built-in template for the type")
    group.add_argument("--enable-thinking", nargs="?", const="true", metavar="true|false",
                       help="passed to the chat template as enable_thinking (Qwen3: false puts an empty think "
                            "block in the prompt, outside the loss). Default: not passed")
    group.add_argument("--map-keys", metavar="JSON",
                       help="column names and tags, MindSpeed-LLM's --map-keys, e.g. "
                            "'{\"prompt\": \"question\", \"query\": \"\", \"response\": \"answer\"}'")
    group.add_argument("--pack", action="store_true",
                       help="put several whole conversations in one sample of at most --seq-length tokens (pairwise "
                            "handlers: several whole pairs, each side of a sample at most --seq-length tokens)")
    group.add_argument("--neat-pack", action="store_true",
                       help="the same as --pack: conversation boundaries are always kept (attention_mask)")
    group.add_argument("--seq-length", type=_positive, metavar="N",
                       help="the longest sample; longer conversations are skipped and counted (required "
                            "with --pack)")
    group = parser.add_argument_group("runtime")
    group.add_argument("--workers", type=_positive, default=1,
                       help="tokenizing processes (default 1: tokenize in this process, where the "
                            "tokenizers library may still use several threads)")
    group.add_argument("--batch-size", type=_positive, default=1000,
                       help="documents per chunk handed to a worker and encoded in one batch (default 1000)")
    group.add_argument("--log-interval", type=_non_negative, default=10000,
                       help="print progress every N documents (default 10000; 0: only the summary)")
    return parser


def _pre_parser() -> argparse.ArgumentParser:
    """Our flags plus the tokenizer paths: enough to check cheap things before importing Megatron."""
    parser = argparse.ArgumentParser(prog=PROG, add_help=False, allow_abbrev=False)
    add_tool_args(parser, required=False)
    for flag in ("--tokenizer-type", "--tokenizer-model", "--vocab-file", "--merge-file"):
        parser.add_argument(flag)
    return parser


def full_parser():
    """Our flags and Megatron's own tokenizer flags (imports adaptor and Megatron)."""
    _import_megatron()
    from megatron.training.arguments import _add_tokenizer_args

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_tool_args(parser)
    _add_tokenizer_args(parser)
    return parser


def _import_megatron() -> None:
    """``import adaptor`` as training does, without its banner or Megatron's import-time noise."""
    os.environ.setdefault("ADAPTOR_QUIET", "1")
    # Tokenizing needs no accelerator; the tokenizer patches apply on every backend, and a CPU
    # backend keeps device runtimes (and their threads) out of the process we fork workers from.
    os.environ.setdefault("ADAPTOR_BACKEND", "cpu")
    import logging

    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Apex/Transformer Engine missing: irrelevant here
        import adaptor  # noqa: F401
        import megatron.training.arguments  # noqa: F401


def _output_prefix(prefix: str, key: str) -> str:
    return f"{prefix}_{key}_document"


INSTRUCTION_FLAGS = {"--prompt-type": "prompt_type", "--enable-thinking": "enable_thinking",
                     "--map-keys": "map_keys", "--pack": "pack", "--neat-pack": "neat_pack",
                     "--seq-length": "seq_length"}


ALL_HANDLERS = (*instruction_data.HANDLERS, *pairwise_data.HANDLERS)


def handler_fields(handler: str) -> tuple:
    """The datasets a handler writes (PREFIX_packed_{field}_document)."""
    if handler in pairwise_data.HANDLERS:
        return pairwise_data.FIELDS + pairwise_data.SEGMENT_FIELDS
    return instruction_data.FIELDS


def instruction_settings(opts: argparse.Namespace):
    """The instruction flags, checked (no tokenizer needed); None for a pretraining run."""
    if opts.handler_name is None:
        given = [flag for flag, dest in INSTRUCTION_FLAGS.items() if getattr(opts, dest) not in (None, False)]
        if given:
            raise ToolError(f"{given[0]} applies to instruction datasets: add --handler-name "
                            f"{' or '.join(ALL_HANDLERS)}")
        return None
    if opts.handler_name not in ALL_HANDLERS:
        raise ToolError(f"--handler-name {opts.handler_name}: this tool builds "
                        f"{', '.join(ALL_HANDLERS)} (and pretraining text without --handler-name)")
    if opts.prompt_type is None:
        raise ToolError(f"--handler-name {opts.handler_name} needs --prompt-type "
                        f"({', '.join(chat_template.PROMPT_TYPES)})")
    try:
        kind = chat_template.prompt_type(opts.prompt_type)
    except chat_template.ChatTemplateError as exc:
        raise ToolError(str(exc)) from None
    thinking = None
    if opts.enable_thinking is not None:
        thinking = {"true": True, "false": False}.get(opts.enable_thinking.lower())
        if thinking is None:
            raise ToolError(f"--enable-thinking {opts.enable_thinking}: expected true or false")
    pairwise = opts.handler_name in pairwise_data.HANDLERS
    if pairwise:
        keys = pairwise_data.parse_map_keys(opts.map_keys, opts.handler_name)
    else:
        keys = instruction_data.parse_map_keys(opts.map_keys, opts.handler_name)
    pack = bool(opts.pack or opts.neat_pack)
    if pack and opts.seq_length is None:
        raise ToolError(f"{'--pack' if opts.pack else '--neat-pack'} needs --seq-length N (the sample length "
                        f"conversations are packed into)")
    return argparse.Namespace(handler=opts.handler_name, kind=kind, enable_thinking=thinking, keys=keys, pack=pack,
                              seq_length=opts.seq_length)


def instruction_prefix(prefix: str, field: str) -> str:
    return f"{prefix}_packed_{field}_document"


def instruction_meta_path(prefix: str) -> str:
    return f"{prefix}_packed_meta.json"


def precheck(opts: argparse.Namespace) -> list:
    """Checks that need no tokenizer; returns the input files."""
    instruction = instruction_settings(opts)
    try:
        files = resolve_inputs(opts.input)
        formats = {path: file_format(path, opts.text_document_per) for path in files}
        if instruction is not None:
            formats = {path: instruction_data.check_input_format(path) for path in files}
    except InputError as exc:
        raise ToolError(str(exc)) from exc
    if instruction is None and len(set(opts.json_keys)) != len(opts.json_keys):
        raise ToolError(f"--json-keys names a key twice: {' '.join(opts.json_keys)}")
    text_files = [p for p, kind in formats.items() if kind.startswith("text")]
    if text_files and len(opts.json_keys) > 1:
        raise ToolError(f"{text_files[0]}: plain text has one document field, so --json-keys takes "
                        f"one key (it names the output); got {len(opts.json_keys)}")
    parquet_files = [p for p, kind in formats.items() if kind == "parquet"]
    if parquet_files and not parquet_available():
        raise ToolError(f"{parquet_files[0]}: reading parquet needs pyarrow (pip install pyarrow)")
    directory = os.path.dirname(opts.output_prefix) or "."
    if not os.path.basename(opts.output_prefix):
        raise ToolError(f"--output-prefix {opts.output_prefix}: needs a file name part, not only a directory")
    if not os.path.isdir(directory):
        raise ToolError(f"--output-prefix {opts.output_prefix}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ToolError(f"--output-prefix {opts.output_prefix}: directory {directory} is not writable")
    inputs = {os.path.realpath(p) for p in files}
    if instruction is None:
        outputs = [_output_prefix(opts.output_prefix, key) + ext for key in opts.json_keys for ext in (".bin", ".idx")]
    else:
        outputs = [instruction_prefix(opts.output_prefix, field) + ext for field in handler_fields(opts.handler_name)
                   for ext in (".bin", ".idx")] + [instruction_meta_path(opts.output_prefix)]
    for out in outputs:
        if os.path.isdir(out):
            raise ToolError(f"output {out} is a directory")
        if os.path.realpath(out) in inputs:
            raise ToolError(f"output {out} is also an input file")
    for flag, path in (("--tokenizer-model", opts.tokenizer_model), ("--vocab-file", opts.vocab_file),
                       ("--merge-file", opts.merge_file)):
        if path and not os.path.exists(path) and not (flag == "--tokenizer-model" and _hub_name(path)):
            raise ToolError(f"{flag} {path}: no such file or directory")
    return files


def _hub_name(path: str) -> bool:
    """``org/name`` with transformers installed: a Hub id that transformers may resolve."""
    import importlib.util

    parts = path.split("/")
    return (len(parts) == 2 and all(parts) and not path.startswith((".", "~"))
            and importlib.util.find_spec("transformers") is not None)


# Tokenizer -----------------------------------------------------------------------------------

class JsonTokenizer:
    """What this tool reads of Megatron's ``MegatronTokenizerText`` (``vocab_size``, ``eod``, ``tokenize``),
    over the very library object the training run builds for a ``tokenizer.json`` (the
    ``TokenizerJson`` of adaptor/tokenizer_json.py, with the arguments Megatron's ``build_tokenizer``
    gives it): the same ids, without importing torch or Megatron."""

    def __init__(self, library):
        self._tokenizer = library

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.vocab_size

    @property
    def eod(self):
        return self._tokenizer.eod

    def tokenize(self, text: str):
        return self._tokenizer.text_to_ids(text)


def plain_tokenizer_json(args: argparse.Namespace) -> bool:
    """A HuggingFaceTokenizer from a tokenizer.json with no other tokenizer option: Megatron would build
    exactly a TokenizerJson (patches/hf/tokenizer_json.py), which this tool can build itself.

    The training run's rule holds here too: a tokenizer.json that TokenizerJson does not tokenize as
    transformers does (``unreproducible``) goes through Megatron's build, to upstream's wrapper, when
    transformers is installed, and stops this tool naming the setting when it is not."""
    if getattr(args, "tokenizer_type", None) != "HuggingFaceTokenizer" or not args.tokenizer_model:
        return False
    if args.vocab_file or args.merge_file:
        return False
    module = _tokenizer_json_module()
    if module.find_tokenizer_json(args.tokenizer_model) is None:
        return False
    reason = module.unreproducible(args.tokenizer_model)
    if reason is None:
        return True
    if importlib.util.find_spec("transformers") is None:
        raise ToolError(module.refusal(reason))
    return False


def _tokenizer_json_module():
    """adaptor/tokenizer_json.py on its own (json and the tokenizers library only), as for the tables below."""
    return _standalone("tokenizer_json_standalone", "tokenizer_json.py")


def build_megatron_tokenizer(args: argparse.Namespace):
    if getattr(args, "fast_tokenizer", False):
        try:
            return JsonTokenizer(_tokenizer_json_module().TokenizerJson(
                args.tokenizer_model, additional_special_tokens=[], include_special_tokens=True, chat_template=None))
        except (OSError, ValueError) as exc:
            detail = " ".join(str(exc).split()) or type(exc).__name__
            raise ToolError(f"cannot build the {args.tokenizer_type} tokenizer from {args.tokenizer_model}: "
                            f"{detail}") from exc
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer

    if args.tokenizer_type is None:
        raise ToolError("--tokenizer-type is required (e.g. HuggingFaceTokenizer with --tokenizer-model)")
    args.rank = 0
    args.tensor_model_parallel_size = 1
    args.make_vocab_size_divisible_by = 128
    args.pad_vocab_size = False  # the model pads its embedding; token ids do not change
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return build_tokenizer(args)
    except Exception as exc:
        source = args.tokenizer_model or args.vocab_file or "its defaults"
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise ToolError(f"cannot build the {args.tokenizer_type} tokenizer from {source}: {detail}") from exc


def batch_encoder(tok):
    """``texts -> list of id lists``: the library's ``encode_batch`` when it has one, else ``tokenize``."""
    if isinstance(tok, JsonTokenizer):
        return tok._tokenizer.encode_batch, True
    from megatron.core.tokenizers.text.text_tokenizer import MegatronTokenizerText

    library = getattr(tok, "_tokenizer", None)
    plain_tokenize = getattr(type(tok), "tokenize", None) is MegatronTokenizerText.tokenize
    if plain_tokenize and callable(getattr(library, "encode_batch", None)):
        return library.encode_batch, True
    return (lambda texts: [tok.tokenize(t) for t in texts]), False


def end_of_document(tok):
    try:
        eod = tok.eod
    except Exception:  # some libraries raise instead of returning None
        eod = None
    return None if eod is None else int(eod)


def choose_dtype(requested: str, vocab_size: int):
    if requested == "auto":  # Megatron's rule, DType.optimal_dtype: uint16 below 65500, else int32
        return np.dtype(np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32)
    if vocab_size > DTYPE_LIMITS[requested]:
        raise ToolError(f"--dtype {requested} holds token ids below {DTYPE_LIMITS[requested]}, but the "
                        f"tokenizer's vocabulary has {vocab_size} tokens; use --dtype int32 or auto")
    return np.dtype(requested)


# Workers -------------------------------------------------------------------------------------

class _State:
    """What a worker needs; set before the pool forks (or rebuilt in a spawned worker)."""

    encode = None
    keys: list = []
    skip_bad = False
    eod = None
    dtype = np.dtype(np.int32)


def _encode_texts(texts):
    """Encode a batch; if the batch fails, find the documents that fail alone.

    An empty string is an empty document without asking the tokenizer (some,
    like NullTokenizer, raise on it; one that adds a BOS would make it non-empty).
    """
    if "" in texts:
        present = [i for i, text in enumerate(texts) if text]
        ids, failed = _encode_texts([texts[i] for i in present]) if present else ([], {})
        full = [[] for _ in texts]
        for i, one in zip(present, ids):
            full[i] = one
        return full, {present[i]: message for i, message in failed.items()}
    try:
        return _State.encode(texts), {}
    except Exception:
        ids, failed = [], {}
        for i, text in enumerate(texts):
            try:
                ids.extend(_State.encode([text]))
            except Exception as exc:
                ids.append([])
                failed[i] = " ".join(str(exc).split()) or type(exc).__name__
        return ids, failed


def encode_chunk(chunk):
    """Parse and tokenize one chunk: per key, the flat token array, lengths, and empty count."""
    parsed = parse_chunk(chunk, _State.keys, _State.skip_bad)
    result = {"records": parsed.n_records, "bytes": parsed.n_bytes, "bad": parsed.n_bad,
              "bad_lines": parsed.bad, "error": parsed.error, "keys": {}}
    if parsed.error:
        return result
    encoded, failed = {}, {}
    for key in _State.keys:
        encoded[key], key_failed = _encode_texts(parsed.texts[key])
        for i, message in key_failed.items():
            failed.setdefault(i, f"cannot tokenize key {key!r}: {message}")
    if failed:  # a record that does not tokenize is a bad line, for every key
        for i in sorted(failed):
            message = f"{parsed.where[i]}: {failed[i]}"
            if not _State.skip_bad:
                result["error"] = message
                return result
            result["bad"] += 1
            if len(result["bad_lines"]) < MAX_REPORTED_BAD:
                result["bad_lines"].append(message)
        keep = [i for i in range(parsed.n_records) if i not in failed]
        encoded = {key: [ids[i] for i in keep] for key, ids in encoded.items()}
        result["records"] = len(keep)
    limit = DTYPE_LIMITS.get(_State.dtype.name, 1 << 31)
    for key, ids in encoded.items():
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
        if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= limit):
            bad_id = int(flat.max()) if int(flat.max()) >= limit else int(flat.min())
            result["error"] = (f"{chunk.path}: the tokenizer produced token id {bad_id}, which "
                               f"{_State.dtype.name} cannot hold; use --dtype int32")
            return result
        nonempty = lengths > 0
        empty = int(lengths.size - nonempty.sum())
        lengths = lengths[nonempty]
        if _State.eod is not None and lengths.size:
            flat = np.insert(flat, np.cumsum(lengths), _State.eod)
            lengths = lengths + 1
        result["keys"][key] = (flat.astype(_State.dtype), lengths, empty)
    return result


def _init_worker(spawn_args) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and shuts us down
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    _die_with_parent()
    if spawn_args is not None:  # no fork on this platform: build our own tokenizer
        args, keys, skip_bad, eod, dtype = spawn_args
        if not getattr(args, "fast_tokenizer", False):
            _import_megatron()
        _State.encode = batch_encoder(build_megatron_tokenizer(args))[0]
        _State.keys, _State.skip_bad, _State.eod, _State.dtype = keys, skip_bad, eod, np.dtype(dtype)


def _die_with_parent() -> None:
    """A worker must not outlive a parent killed with SIGKILL (it would wait on its queue forever)."""
    parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGKILL, 0, 0, 0) == 0:  # PR_SET_PDEATHSIG
            if os.getppid() != parent:
                os._exit(1)
            return
    except (OSError, AttributeError):
        pass
    import threading

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _results(chunks, workers: int, max_in_flight: int, spawn_args, work=None):
    """Encoded chunks (``work(chunk)``, by default :func:`encode_chunk`), in input order, with at most
    ``max_in_flight`` chunks queued."""
    work = work or encode_chunk
    if workers == 1:
        for chunk in chunks:
            yield work(chunk)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    fork = "fork" in multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if fork else "spawn")
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_init_worker,
                               initargs=(None if fork else spawn_args,))
    pending: collections.deque = collections.deque()
    try:
        for chunk in chunks:
            pending.append(pool.submit(work, chunk))
            if len(pending) >= max_in_flight:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except BrokenProcessPool as exc:
        raise ToolError(f"a worker process died ({exc}); out of memory? try fewer --workers") from exc
    finally:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


# The run -------------------------------------------------------------------------------------

def _rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def _human(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def _say(message: str) -> None:
    try:
        print(f"[{PROG}] {message}", flush=True)
    except BrokenPipeError:
        pass


def run(args: argparse.Namespace, files: list) -> None:
    instruction = instruction_settings(args)
    if instruction is not None:
        return run_instruction(args, instruction, files)
    keys = list(args.json_keys)
    tok = build_megatron_tokenizer(args)
    vocab_size = int(tok.vocab_size)
    eod = None
    if args.append_eod:
        eod = end_of_document(tok)
        if eod is None:
            raise ToolError(f"--append-eod: the {args.tokenizer_type} tokenizer from "
                            f"{args.tokenizer_model or args.vocab_file} has no end-of-document token")
    dtype = choose_dtype(args.dtype, vocab_size)
    encode, batched = batch_encoder(tok)
    if args.workers > 1:
        # Each worker encodes single-threaded (N processes, not N times the library's thread pool),
        # and setting it explicitly keeps the tokenizers library quiet about forking.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _State.encode, _State.keys, _State.skip_bad, _State.eod, _State.dtype = (
        encode, keys, args.skip_bad_lines, eod, dtype)
    prefixes = [_output_prefix(args.output_prefix, key) for key in keys]
    for prefix in prefixes:
        for path in remove_stale_temps(prefix):
            _say(f"removed {path}, left by an interrupted run")
    library = type(getattr(tok, "_tokenizer", tok)).__name__
    _say(f"{len(files)} input file(s); tokenizer {args.tokenizer_type} ({library}"
         f"{', batched' if batched else ''}), vocabulary {vocab_size}, dtype {dtype.name}, "
         f"eod {'appended (id %d)' % eod if eod is not None else 'not appended'}, workers {args.workers}")

    writers, results = {}, None
    try:
        for key, prefix in zip(keys, prefixes):
            writers[key] = IndexedDatasetWriter(prefix, dtype)
        chunks = iter_chunks(files, keys, args.text_document_per, args.batch_size)
        spawn_args = (args, keys, args.skip_bad_lines, eod, dtype.name)
        start = time.perf_counter()
        docs = tokens = nbytes = bad = 0
        empty = dict.fromkeys(keys, 0)
        next_log = args.log_interval or None
        quoted = 0
        results = _results(chunks, args.workers, 2 * args.workers + 2, spawn_args)
        for result in results:
            quoted = _report_bad(result, quoted, args.skip_bad_lines, "lines")
            docs += result["records"]
            nbytes += result["bytes"]
            bad += result["bad"]
            for key, (flat, lengths, n_empty) in result["keys"].items():
                writers[key].add_documents(flat, lengths)
                tokens += int(flat.size)
                empty[key] += n_empty
            if next_log is not None and docs >= next_log:
                seconds = time.perf_counter() - start
                _say(f"{docs} documents, {_human(tokens)} tokens, {nbytes / 1e6:.1f} MB | "
                     f"{_rate(docs, seconds):.0f} docs/s, {_human(_rate(tokens, seconds))} tokens/s, "
                     f"{_rate(nbytes, seconds) / 1e6:.2f} MB/s")
                next_log = (docs // args.log_interval + 1) * args.log_interval
        for key, writer in writers.items():
            if writer.n_documents == 0:
                raise ToolError(
                    f"no documents to write for key {key!r}: {docs} read, {empty[key]} empty, "
                    f"{bad} bad lines skipped (input: {', '.join(args.input)})")
        for writer in writers.values():
            writer.finalize()
        for writer in writers.values():
            writer.publish()
        seconds = time.perf_counter() - start
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    finally:
        if results is not None:
            results.close()  # shuts the worker pool down now, not when the frame is collected
    skipped_empty = sum(empty.values())
    empty_detail = "" if len(keys) == 1 else " (" + ", ".join(f"{k} {n}" for k, n in empty.items()) + ")"
    outputs = ", ".join(f"{w.bin_path} / .idx ({w.n_documents} docs)" for w in writers.values())
    _say(f"done: {docs} documents, {tokens} tokens, {skipped_empty} empty skipped{empty_detail}, "
         f"{bad} bad lines skipped, {nbytes} bytes in {seconds:.2f} s | {_rate(docs, seconds):.0f} docs/s, "
         f"{_rate(tokens, seconds):.0f} tokens/s, {_rate(nbytes, seconds) / 1e6:.2f} MB/s | wrote {outputs}")


# Instruction datasets ------------------------------------------------------------------------

class _Instruct:
    """What an instruction worker needs; set before the pool forks."""

    renderer = None
    convert = None
    keys: dict = {}
    skip_bad = False
    eod = None


def encode_instruction_chunk(chunk):
    """Records -> conversations -> ids and labels: flat int32 arrays and the length of each conversation."""
    records, nbytes = instruction_data.chunk_records(chunk)
    result = {"records": 0, "bytes": nbytes, "bad": 0, "bad_lines": [], "error": None}
    problems, prepared = [], []  # (index, message); (index, where, text, assistant turns)
    for index, (where, record) in enumerate(records):
        try:
            if isinstance(record, chat_template.RecordError):
                raise record
            messages, tools = _Instruct.convert(record, _Instruct.keys)
            turns = sum(1 for m in messages if m.get("role") == "assistant")
            if turns == 0:
                raise chat_template.RecordError("the conversation has no assistant turn")
            prepared.append((index, where, _Instruct.renderer.render(messages, tools), turns))
        except chat_template.RecordError as exc:
            problems.append((index, f"{where}: {exc}"))
    encoded = _Instruct.renderer.encode_rendered([p[2] for p in prepared], [p[3] for p in prepared]) if prepared else []
    ids, labels, lengths = [], [], []
    for (index, where, _, _), item in zip(prepared, encoded):
        if isinstance(item, chat_template.RecordError):
            problems.append((index, f"{where}: {item}"))
            continue
        one_ids, one_labels = item
        if _Instruct.eod is not None:
            one_ids, one_labels = one_ids + [_Instruct.eod], one_labels + [_Instruct.eod]
        ids.append(one_ids)
        labels.append(one_labels)
        lengths.append(len(one_ids))
    problems.sort()
    if problems and not _Instruct.skip_bad:
        result["error"] = problems[0][1]
        return result
    result["bad"] = len(problems)
    result["bad_lines"] = [message for _, message in problems[:MAX_REPORTED_BAD]]
    result["records"] = len(lengths)
    result["lengths"] = np.asarray(lengths, dtype=np.int64)
    total = int(result["lengths"].sum())
    result["ids"] = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=total)
    result["labels"] = np.fromiter(itertools.chain.from_iterable(labels), dtype=np.int64, count=total)
    return result


def encode_pairwise_chunk(chunk):
    """Records -> (prompt, chosen, rejected) -> each side's ids and labels, as lists of int64 arrays."""
    records, nbytes = instruction_data.chunk_records(chunk)
    result = {"records": 0, "bytes": nbytes, "bad": 0, "bad_lines": [], "error": None, "pairs": []}
    problems = []
    for index, (where, record) in enumerate(records):
        try:
            if isinstance(record, chat_template.RecordError):
                raise record
            prompt, chosen, rejected, tools = _Instruct.convert(record, _Instruct.keys)
            sides = pairwise_data.encode_pair(_Instruct.renderer, prompt, chosen, rejected, tools)
        except chat_template.RecordError as exc:
            problems.append((index, f"{where}: {exc}"))
            continue
        if _Instruct.eod is not None:
            sides = tuple(side + [_Instruct.eod] for side in sides)
        result["pairs"].append(tuple(np.asarray(side, dtype=np.int64) for side in sides))
    if problems and not _Instruct.skip_bad:
        result["error"] = problems[0][1]
        return result
    result["bad"] = len(problems)
    result["bad_lines"] = [message for _, message in problems[:MAX_REPORTED_BAD]]
    result["records"] = len(result["pairs"])
    return result


def _tokenizers_library(tok, args):
    """The ``tokenizers.Tokenizer`` under Megatron's tokenizer, and the directory of its files."""
    library = getattr(tok, "_tokenizer", None)
    inner, path = getattr(library, "tokenizer", None), getattr(library, "path", None)
    try:
        from tokenizers import Tokenizer
    except ImportError:
        Tokenizer = None
    if Tokenizer is None or not isinstance(inner, Tokenizer) or path is None:
        raise ToolError(f"instruction datasets need a tokenizer.json read by the tokenizers library "
                        f"(--tokenizer-type HuggingFaceTokenizer with a directory holding one); the "
                        f"{args.tokenizer_type} tokenizer from {args.tokenizer_model or args.vocab_file} is not")
    return inner, os.path.dirname(str(path))


def run_instruction(args: argparse.Namespace, settings, files: list) -> None:
    tok = build_megatron_tokenizer(args)
    vocab_size = int(tok.vocab_size)
    library, directory = _tokenizers_library(tok, args)
    eod = None
    if args.append_eod:
        eod = end_of_document(tok)
        if eod is None:
            raise ToolError(f"--append-eod: the {args.tokenizer_type} tokenizer from "
                            f"{args.tokenizer_model or args.vocab_file} has no end-of-document token")
    # MindSpeed-LLM writes all three datasets as int32 (labels hold -100); --dtype uint16 narrows input_ids.
    dtype = np.dtype(np.int32) if args.dtype == "auto" else choose_dtype(args.dtype, vocab_size)
    template_kwargs = {} if settings.enable_thinking is None else {"enable_thinking": settings.enable_thinking}
    try:
        renderer = chat_template.ChatRenderer(library, directory, settings.kind, template_kwargs)
    except chat_template.ChatTemplateError as exc:
        raise ToolError(str(exc)) from None
    workers = args.workers
    if workers > 1:
        import multiprocessing

        if "fork" not in multiprocessing.get_all_start_methods():
            _say("--workers: instruction datasets are built in one process on this platform (no fork)")
            workers = 1
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    pairwise = settings.handler in pairwise_data.HANDLERS
    converters = pairwise_data.CONVERTERS if pairwise else instruction_data.CONVERTERS
    _Instruct.renderer, _Instruct.convert = renderer, converters[settings.handler]
    _Instruct.keys, _Instruct.skip_bad, _Instruct.eod = settings.keys, args.skip_bad_lines, eod
    prefix = args.output_prefix
    prefixes = {field: instruction_prefix(prefix, field) for field in handler_fields(settings.handler)}
    for one in prefixes.values():
        for path in remove_stale_temps(one):
            _say(f"removed {path}, left by an interrupted run")
    seq_length = settings.seq_length
    layout = f"packed into samples of at most {seq_length} tokens" if settings.pack else "one conversation per sample"
    if pairwise:
        layout = (f"whole chosen/rejected pairs packed into samples of at most {seq_length} tokens a side"
                  if settings.pack else "one chosen/rejected pair per sample")
    thinking = "not passed" if settings.enable_thinking is None else str(settings.enable_thinking).lower()
    _say(f"{len(files)} input file(s); {settings.handler}, --prompt-type {settings.kind.name}, chat template "
         f"{chat_template.describe(renderer)}, enable_thinking {thinking}, {layout}; tokenizer vocabulary "
         f"{vocab_size}, workers {workers}")

    writers, results, meta_tmp = {}, None, None
    meta_path = instruction_meta_path(prefix)
    counts = dict(conversations=0, samples=0, tokens=0, loss_tokens=0, too_long_skipped=0, bad_records_skipped=0)
    packer = instruction_data.Packer(seq_length) if settings.pack else None

    def write(samples: list) -> None:
        """Samples (lists of (ids, labels) conversations) into the three datasets, one document each."""
        if not samples:
            return
        ids = np.concatenate([c[0] for sample in samples for c in sample])
        labels = np.concatenate([c[1] for sample in samples for c in sample])
        mask = np.concatenate([np.full(len(c[0]), k, dtype=np.int32)
                               for sample in samples for k, c in enumerate(sample, 1)])
        lengths = [sum(len(c[0]) for c in sample) for sample in samples]
        writers["input_ids"].add_documents(ids.astype(dtype), lengths)
        writers["labels"].add_documents(labels.astype(np.int32), lengths)
        writers["attention_mask"].add_documents(mask, lengths)
        counts["samples"] += len(samples)
        counts["tokens"] += int(ids.size)
        counts["loss_tokens"] += int(np.count_nonzero(labels != chat_template.IGNORE_INDEX))

    def keep_pairs(pairs: list) -> list:
        """Pairs (chosen ids, chosen labels, rejected ids, rejected labels) that fit: a pair with a side
        longer than --seq-length is skipped whole."""
        if seq_length is not None:
            long = [p for p in pairs if max(len(p[0]), len(p[2])) > seq_length]
            counts["too_long_skipped"] += len(long)
            pairs = [p for p in pairs if max(len(p[0]), len(p[2])) <= seq_length]
        counts["conversations"] += len(pairs)
        return pairs

    def write_pairs(samples: list) -> None:
        """Samples (lists of pairs, one pair each unless --pack) into the six datasets, one document each."""
        if not samples:
            return
        for k, field in enumerate(pairwise_data.FIELDS):
            values = np.concatenate([p[k] for sample in samples for p in sample])
            if values.size and field.endswith("input_ids") and int(values.max()) >= limit:
                raise ToolError(f"the tokenizer produced token id {int(values.max())}, which {dtype.name} cannot "
                                f"hold; use --dtype int32")
            kind = dtype if field.endswith("input_ids") else np.int32
            writers[field].add_documents(values.astype(kind), [sum(len(p[k]) for p in one) for one in samples])
        for side, field in zip((0, 2), pairwise_data.SEGMENT_FIELDS):
            pair_of_token = np.concatenate([np.full(len(p[side]), j, dtype=np.int32)
                                            for sample in samples for j, p in enumerate(sample, 1)])
            writers[field].add_documents(pair_of_token, [sum(len(p[side]) for p in one) for one in samples])
        pairs = [p for sample in samples for p in sample]
        counts["samples"] += len(samples)
        counts["tokens"] += sum(len(p[0]) + len(p[2]) for p in pairs)
        counts["loss_tokens"] += sum(int(np.count_nonzero(p[k] != chat_template.IGNORE_INDEX))
                                     for p in pairs for k in (1, 3))

    limit = DTYPE_LIMITS.get(dtype.name, 1 << 31)
    try:
        for field, one in prefixes.items():
            writers[field] = IndexedDatasetWriter(one, dtype if field.endswith("input_ids") else np.int32)
        start = time.perf_counter()
        nbytes, quoted = 0, 0
        next_log = args.log_interval or None
        chunks = instruction_data.iter_record_chunks(files, args.batch_size)
        results = _results(chunks, workers, 2 * workers + 2, None,
                           work=encode_pairwise_chunk if pairwise else encode_instruction_chunk)
        for result in results:
            quoted = _report_bad(result, quoted, args.skip_bad_lines, "records")
            nbytes += result["bytes"]
            counts["bad_records_skipped"] += result["bad"]
            if pairwise:
                kept = keep_pairs(result["pairs"])
                if packer is None:
                    write_pairs([[p] for p in kept])
                else:
                    write_pairs([one for p in kept for one in packer.add(p, (len(p[0]), len(p[2])))])
                continue
            if result["ids"].size and int(result["ids"].max()) >= limit:
                raise ToolError(f"the tokenizer produced token id {int(result['ids'].max())}, which "
                                f"{dtype.name} cannot hold; use --dtype int32")
            bounds = np.concatenate([[0], np.cumsum(result["lengths"])])
            done = []
            for k, length in enumerate(result["lengths"].tolist()):
                if seq_length is not None and length > seq_length:
                    counts["too_long_skipped"] += 1
                    continue
                one = (result["ids"][bounds[k]:bounds[k + 1]], result["labels"][bounds[k]:bounds[k + 1]])
                counts["conversations"] += 1
                done += packer.add(one, length) if packer is not None else [[one]]
            write(done)
            if next_log is not None and counts["conversations"] >= next_log:
                seconds = time.perf_counter() - start
                _say(f"{counts['conversations']} conversations, {counts['samples']} samples, "
                     f"{_human(counts['tokens'])} tokens | {_rate(counts['conversations'], seconds):.0f} "
                     f"conversations/s, {_human(_rate(counts['tokens'], seconds))} tokens/s")
                next_log = (counts["conversations"] // args.log_interval + 1) * args.log_interval
        if packer is not None:
            (write_pairs if pairwise else write)(packer.flush())
        if counts["samples"] == 0:
            raise ToolError(f"no conversations to write: {counts['too_long_skipped']} longer than --seq-length "
                            f"{seq_length}, {counts['bad_records_skipped']} bad records skipped (input: "
                            f"{', '.join(args.input)})")
        for writer in writers.values():
            writer.finalize()
        meta = {
            "handler": settings.handler, "prompt_type": settings.kind.name,
            "template_source": renderer.template.source, "template_sha256": renderer.template.sha256,
            "enable_thinking": settings.enable_thinking, "pack": settings.pack, "seq_length": seq_length,
            "append_eod": eod is not None, "map_keys": instruction_data.public_keys(settings.keys),
            "fields": {field: os.path.basename(one) for field, one in prefixes.items()},
            "dtype": {field: dtype.name if field.endswith("input_ids") else "int32" for field in prefixes},
            "pairwise": pairwise,
            "ignore_index": chat_template.IGNORE_INDEX,
            "loss": "assistant turns: after the turn marker (and the generation prompt's own text) through the "
                    "end-of-turn token",
            "assistant_marker": settings.kind.marker, "end_of_turn": settings.kind.end,
            "generation_suffix": renderer.generation_suffix,
            "tokenizer": args.tokenizer_model, "vocab_size": vocab_size, "counts": counts,
        }
        meta_tmp = temp_path(meta_path, "meta")
        with open(meta_tmp, "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2, ensure_ascii=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        if os.path.lexists(meta_path):
            os.remove(meta_path)  # an old summary never describes new datasets
        for writer in writers.values():
            writer.publish()
        os.replace(meta_tmp, meta_path)
        meta_tmp = None
        seconds = time.perf_counter() - start
    except BaseException:
        for writer in writers.values():
            writer.abort()
        if meta_tmp is not None and os.path.exists(meta_tmp):
            os.remove(meta_tmp)
        raise
    finally:
        if results is not None:
            results.close()
    _say(f"done: {counts['conversations']} conversations, {counts['samples']} samples, {counts['tokens']} tokens, "
         f"{counts['loss_tokens']} loss tokens, {counts['too_long_skipped']} longer than --seq-length skipped, "
         f"{counts['bad_records_skipped']} bad records skipped, {nbytes} bytes in {seconds:.2f} s | "
         f"{_rate(counts['conversations'], seconds):.0f} conversations/s | wrote "
         f"{prefix}_packed_{{{','.join(prefixes)}}}_document.bin/.idx, {meta_path}")


def _report_bad(result: dict, quoted: int, skip_bad: bool, what: str) -> int:
    """Quote a chunk's skipped lines (the first MAX_QUOTED_BAD of the run) and stop at its error; the new count."""
    for message in result["bad_lines"]:
        if quoted < MAX_QUOTED_BAD:
            print(f"[{PROG}] skipped {message}", file=sys.stderr, flush=True)
            quoted += 1
    if result["error"]:
        raise ToolError(result["error"] + ("" if skip_bad else f" (--skip-bad-lines skips such {what})"))
    return quoted


def _on_signal(signum, frame):
    raise Interrupted(signum)


def _mindspeed_llm_tables():
    """``adaptor/command_line/mindspeed_llm.py`` loaded on its own (plain tables and functions), so a
    refused flag is one line before torch and Megatron load; importing it through ``adaptor`` would
    load both."""
    return _standalone("mindspeed_llm_tables", "command_line/mindspeed_llm.py")


def _standalone(name: str, path: str):
    """A torch-free module of adaptor/ loaded by file, once, without the package (which loads torch)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "adaptor" / path)
        module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
        spec.loader.exec_module(module)
    return sys.modules[name]


def main(argv=None) -> int:
    rewrite = _mindspeed_llm_tables().rewrite_preprocess_argv(sys.argv[1:] if argv is None else list(argv))  # MindSpeed-LLM's spellings
    if rewrite.refused:
        print(f"{PROG}: error: {rewrite.refused[0]}", file=sys.stderr, flush=True)
        return 1
    for note in rewrite.notes:
        print(f"{PROG}: {note}", file=sys.stderr, flush=True)
    argv = rewrite.argv
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        files = None
        args = None
        if not {"-h", "--help"} & set(argv):
            opts, unknown = _pre_parser().parse_known_args(argv)
            if opts.input and opts.output_prefix:
                files = precheck(opts)  # before the slow imports: quick answers for common mistakes
                if not unknown and plain_tokenizer_json(opts):  # nothing for Megatron's parser to add
                    args, args.fast_tokenizer = opts, True
        args = args or full_parser().parse_args(argv)
        run(args, files if files is not None else precheck(args))
        return 0
    except (ToolError, InputError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except OSError as exc:  # writing the outputs: disk full, permissions, ...
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"{PROG}: error: {where}{exc.strerror or exc}", file=sys.stderr, flush=True)
        return 1
    except Interrupted as exc:
        print(f"{PROG}: error: interrupted by {exc}; temporary files removed, existing outputs untouched",
              file=sys.stderr, flush=True)
        return 128 + exc.signum
    except KeyboardInterrupt:
        print(f"{PROG}: error: interrupted; temporary files removed, existing outputs untouched",
              file=sys.stderr, flush=True)
        return 130
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


if __name__ == "__main__":
    sys.exit(main())
