"""Preference training through Megatron's loop: MindSpeed-LLM's ``--stage dpo --is-pairwise-dataset``.

Flags (MindSpeed-LLM's names and defaults): ``--is-pairwise-dataset`` (datasets from
``tools/preprocess_data.py``'s pairwise handlers, :mod:`adaptor.preference.pairwise_dataset`),
``--dpo-loss-type sigmoid|hinge|ipo``, ``--dpo-beta``, ``--dpo-label-smoothing``, ``--pref-ftx`` (an SFT
term on the chosen responses), ``--ref-model`` (the reference's checkpoint; default: the policy's
starting weights) and ``--refer-model-iter`` (its iteration, honoured with ``--ref-model``).

Upstream changes, DPO runs only:

* ``megatron.training.training.training_log`` (wrapped) prints the rewards below zero, which Megatron's
  log line leaves out, on a second line.
* ``megatron.training.training.get_forward_backward_func`` (wrapped): the schedule it returns runs the
  frozen reference over each step's micro-batches before the policy, through that same schedule
  (:mod:`adaptor.preference.reference_pass`), because under pipeline parallelism the reference's
  activations cross the stages as the policy's do and its values are needed on the last stage. It also
  sizes the tensors sent between stages for a DPO micro-batch's two rows per pair. The training step and
  the evaluation both take their schedule from this function; Megatron's schedules themselves are
  unchanged.

``posttrain_gpt.py`` holds the DPO forward steps and dataset provider, :mod:`adaptor.preference` the
losses, data, reference and metrics. This feature registers the flags and refuses, in one line, the runs
DPO cannot do here: no pairwise data, no reference to compare with, MTP layers, and pairs packed several
per sample where their boundaries cannot reach attention (middle pipeline stages or virtual stages;
context parallelism across pipeline stages) or where ``--seq-length`` would cut a packed sample's last
pairs. With context parallelism each rank holds a share of every row's positions, and the rows'
log-probabilities are added over the context-parallel group
(:func:`adaptor.preference.losses.sequence_logps`). With virtual pipeline stages the reference is one
chunk per policy chunk, and the reference pass replays every chunk's data iterator.
``--precompute-ref-logps`` computes the reference's values before the first step
(:mod:`adaptor.preference.precompute`) and stores them, ``--ref-logps`` reads them back
(:mod:`adaptor.preference.stored_reference`); a file made for another dataset or sequence length is
refused.
"""
from __future__ import annotations

import os

import sys

from adaptor.features import ArgumentError, Feature

OWNER = __name__
LOSS_TYPES = ("sigmoid", "hinge", "ipo")
TRAINING_LOG = "megatron.training.training.training_log"
SCHEDULE = "megatron.training.training.get_forward_backward_func"


def _get_forward_backward_func(wrapped, instance, call_args, kwargs):
    """Megatron's schedule, with DPO's reference pass before the policy's (see module doc)."""
    from adaptor.preference.reference_pass import with_reference_pass

    return with_reference_pass(wrapped(*call_args, **kwargs))


def _training_log(wrapped, instance, call_args, kwargs):
    """Megatron's log line leaves out loss-dict values below zero; a DPO reward often is (a rejected
    response's, once training pushes it down). Those are printed on a second line for the same
    iteration. TensorBoard receives every value from Megatron itself."""
    from megatron.training import get_args
    from megatron.training.utils import print_rank_last

    names = ("loss_dict", "total_loss_dict", "learning_rate", "iteration", "loss_scale", "report_memory_flag",
             "skipped_iter")
    given = dict(zip(names, call_args), **{k: v for k, v in kwargs.items() if k in names})
    loss_dict, totals, iteration = given["loss_dict"], given["total_loss_dict"], given["iteration"]
    averages = {}
    if not given["skipped_iter"]:
        advanced = totals.get("advanced iterations", 0) + 1
        averages = {key: float(totals.get(key, 0) + value) / advanced for key, value in loss_dict.items()
                    if key.startswith("rewards/")}
    result = wrapped(*call_args, **kwargs)
    printed = iteration % get_args().log_interval == 0 or kwargs.get("is_first_iteration", False)
    negative = {k: v for k, v in averages.items() if v < 0}
    if printed and negative:
        line = "".join(f" {key}: {value:.6E} |" for key, value in negative.items())
        print_rank_last(f" iteration {iteration:8d}/{get_args().train_iters:8d} | below zero, left off the line above |{line}")
    return result


class PreferenceTraining(Feature):
    name = "preference_training"

    def add_arguments(self, group) -> None:
        group.add_argument("--is-pairwise-dataset", action="store_true",
                           help="--data-path names pairwise datasets from tools/preprocess_data.py "
                                "(PREFIX_packed_{chosen,rejected}_{input_ids,labels}_document): with --stage dpo")
        group.add_argument("--dpo-loss-type", default="sigmoid", choices=LOSS_TYPES,
                           help="DPO's loss: sigmoid (DPO), hinge (SLiC) or ipo (IPO, on per-token mean "
                                "log-probabilities)")
        group.add_argument("--dpo-beta", type=float, default=0.1, metavar="BETA",
                           help="DPO's beta: how far the policy may move from the reference (default 0.1)")
        group.add_argument("--dpo-label-smoothing", type=float, default=0.0, metavar="EPS",
                           help="conservative DPO: the share of pairs assumed mislabelled, in [0, 0.5) "
                                "(sigmoid loss only; default 0)")
        group.add_argument("--pref-ftx", type=float, default=0.0, metavar="GAMMA",
                           help="add GAMMA times the chosen responses' per-token negative log-likelihood "
                                "(an SFT term) to the DPO loss (default 0)")
        group.add_argument("--ref-model", default=None, metavar="DIR",
                           help="the reference model: a Megatron checkpoint or a Hugging Face directory (default: the policy as loaded, "
                                "before its first step; with LoRA, the model without its adapters)")
        group.add_argument("--precompute-ref-logps", default=None, metavar="FILE",
                           help="before the first step, compute the reference's log-probabilities of every pair "
                                "of --data-path (on the starting policy itself when that is the reference: no "
                                "copy), write them to FILE (for later runs' --ref-logps) and train against them")
        group.add_argument("--ref-logps", default=None, metavar="FILE",
                           help="read the reference's log-probabilities from FILE (written by "
                                "--precompute-ref-logps) instead of keeping a reference model in memory")
        group.add_argument("--refer-model-iter", type=int, default=1, metavar="N",
                           help="the --ref-model iteration to load (default: its latest)")

    def register_patches(self, pm, ctx) -> None:
        argv = ctx.argv if ctx.argv is not None else sys.argv[1:]
        if "dpo" in argv or "--stage=dpo" in argv:
            pm.register_wrapper(TRAINING_LOG, _training_log, OWNER)
            pm.register_wrapper(SCHEDULE, _get_forward_backward_func, OWNER)

    def validate(self, args, ctx) -> None:
        pairwise, dpo = args.is_pairwise_dataset, args.stage == "dpo"
        if not dpo:
            given = [f for f, d in (("--is-pairwise-dataset", "is_pairwise_dataset"), ("--ref-model", "ref_model"),
                                    ("--dpo-loss-type", "dpo_loss_type"), ("--dpo-beta", "dpo_beta"),
                                    ("--pref-ftx", "pref_ftx"), ("--ref-logps", "ref_logps"),
                                    ("--precompute-ref-logps", "precompute_ref_logps")) if d in ctx.explicit]
            if given:
                raise ArgumentError(f"{given[0]} applies to preference training: add --stage dpo")
            return
        if not pairwise or args.is_instruction_dataset or args.sft or args.mock_data:
            raise ArgumentError("--stage dpo trains on preference pairs: pass --is-pairwise-dataset with --data-path "
                                "from tools/preprocess_data.py --handler-name AlpacaStylePairwiseHandler (not "
                                "--is-instruction-dataset, --sft or --mock-data)")
        lora = bool(getattr(args, "lora_r", None))
        stored = getattr(args, "ref_logps", None)
        if stored and args.ref_model:
            raise ArgumentError("--ref-logps replaces the reference model: drop --ref-model (compute the file "
                                "with --ref-model and --precompute-ref-logps instead)")
        if not (args.load or args.ref_model or getattr(args, "hf_load_dir", None) or lora or stored):
            raise ArgumentError("--stage dpo compares the policy with a reference model, and this run has none: "
                                "give --load (or --hf-load-dir) with the starting model, --ref-model, or LoRA")
        resumed = _resumed_iteration(args)
        if resumed and not (args.ref_model or lora or stored):
            raise ArgumentError(f"--stage dpo resumes from --load {args.load} at iteration {resumed}, so the "
                                f"policy is no longer the starting model: give --ref-model with the model the run "
                                f"started from (or --finetune to start a new run from this checkpoint)")
        if "refer_model_iter" not in ctx.explicit:
            args.refer_model_iter = None  # the --ref-model checkpoint's latest iteration
        elif not args.ref_model:
            raise ArgumentError("--refer-model-iter picks the --ref-model checkpoint's iteration; without "
                                "--ref-model the reference is the policy's starting weights")
        if args.ref_model and lora:
            raise ArgumentError("--ref-model with LoRA: the reference is the base model without its adapters; "
                                "drop --ref-model")
        if args.ref_model and not os.path.isfile(os.path.join(args.ref_model, "config.json")):
            from adaptor.preflight.checkpoint_dirs import check_load_dir

            check_load_dir(args.ref_model, "--ref-model", required="it holds the reference model")
        if args.dpo_beta <= 0:
            raise ArgumentError(f"--dpo-beta {args.dpo_beta:g}: must be positive")
        if not 0 <= args.dpo_label_smoothing < 0.5:
            raise ArgumentError(f"--dpo-label-smoothing {args.dpo_label_smoothing:g}: must be in [0, 0.5)")
        if args.dpo_label_smoothing and args.dpo_loss_type != "sigmoid":
            raise ArgumentError(f"--dpo-label-smoothing applies to --dpo-loss-type sigmoid, not "
                                f"{args.dpo_loss_type}")
        if args.pref_ftx < 0:
            raise ArgumentError(f"--pref-ftx {args.pref_ftx:g}: must be 0 or more")
        if getattr(args, "mtp_num_layers", None):
            raise ArgumentError("--stage dpo does not train MTP layers; drop --mtp-num-layers")
        self._check_datasets(args)
        self._check_stored_reference(args)

    @staticmethod
    def _check_stored_reference(args) -> None:
        """--ref-logps / --precompute-ref-logps: one dataset, whose every pair the file covers."""
        from adaptor.preference import stored_reference
        from adaptor.preference.pairwise_dataset import PairwiseLowLevel
        from adaptor.preflight.data_sources import blend_prefixes, sources

        stored, record = getattr(args, "ref_logps", None), getattr(args, "precompute_ref_logps", None)
        if not (stored or record):
            return
        flag = "--ref-logps" if stored else "--precompute-ref-logps"
        if stored and record:
            raise ArgumentError("--ref-logps reads the reference's values and --precompute-ref-logps writes them: "
                                "give one")
        words = sources(args)
        prefixes = blend_prefixes(words[0][1]) if len(words) == 1 and words[0][0] == "--data-path" else []
        if len(prefixes) != 1:
            raise ArgumentError(f"{flag} holds one value per pair of one dataset: give --data-path a single prefix")
        low = PairwiseLowLevel(prefixes[0], mmap=True)
        if record:
            directory = os.path.dirname(os.path.abspath(record))
            if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
                raise ArgumentError(f"--precompute-ref-logps {record}: directory {directory} does not exist or is "
                                    f"not writable")
            return
        try:
            header, _ = stored_reference.read(stored)
            stored_reference.check_matches(header, stored_reference.header_for(low, args.seq_length), stored)
        except stored_reference.StoredReferenceError as exc:
            raise ArgumentError(str(exc)) from None

    @staticmethod
    def _check_datasets(args) -> None:
        from adaptor.finetune.instruction_dataset import InstructionDataError
        from adaptor.finetune.instruction_dataset import read_meta
        from adaptor.preference.pairwise_dataset import check_prefix
        from adaptor.preflight.data_sources import blend_prefixes, sources

        for flag, words in sources(args):
            for prefix in blend_prefixes(words):
                try:
                    check_prefix(prefix)
                except InstructionDataError as exc:
                    raise ArgumentError(f"--stage dpo: {exc}") from None
                meta = read_meta(prefix) or {}
                built = meta.get("prompt_type")
                if args.prompt_type and built and built != args.prompt_type:
                    raise ArgumentError(f"--prompt-type {args.prompt_type}: {flag} {prefix} was built with "
                                        f"--prompt-type {built}; preprocess it again or pass --prompt-type {built}")
                if meta.get("pack"):
                    _check_packed_pairs(args, flag, prefix, meta)


def _check_packed_pairs(args, flag: str, prefix: str, meta: dict) -> None:
    """Samples that pack several pairs: each pair's sequences must stay whole and apart on every stage."""
    pp, cp = args.pipeline_model_parallel_size, args.context_parallel_size or 1
    packed_for = meta.get("seq_length")
    if packed_for and packed_for > args.seq_length + 1:
        raise ArgumentError(f"{flag} {prefix} packs pairs into samples of up to {packed_for} tokens, longer than "
                            f"--seq-length {args.seq_length} + 1 (the last pairs would lose a side): train with "
                            f"--seq-length {packed_for - 1} or more, or preprocess with --seq-length "
                            f"{args.seq_length + 1}")
    if pp > 2 or getattr(args, "virtual_pipeline_model_parallel_size", None):
        raise ArgumentError(f"{flag} {prefix} packs several pairs per sample, and middle pipeline stages (and "
                            f"virtual stages) receive no batch to keep them apart; use "
                            f"--pipeline-model-parallel-size 2 or less without virtual stages, or preprocess "
                            f"without --pack")
    if pp > 1 and cp > 1:
        raise ArgumentError(f"{flag} {prefix} packs several pairs per sample: with context parallelism their "
                            f"boundaries reach attention as THD, which needs --pipeline-model-parallel-size 1")


def _resumed_iteration(args) -> int:
    """The training iteration ``--load`` resumes at (0: a fresh start, ``--finetune``, or no tracker)."""
    if not args.load or args.finetune:
        return 0
    tracker = os.path.join(args.load, "latest_checkpointed_iteration.txt")
    try:
        with open(tracker) as f:
            text = f.read().strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0
