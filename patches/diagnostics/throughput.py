"""``--log-throughput`` prints MFU beside Megatron's TFLOP/s on every backend; ``--device-peak-tflops``.

Upstream: ``megatron.training.training.training_log`` computes the model TFLOP/s per device
(``num_floating_point_operations`` over the interval time), hands it to
``one_logger_utils.track_e2e_metrics`` and prints "throughput per GPU (TFLOP/s/GPU)" through
``print_rank_last``. It knows no peak, so it prints no utilisation. Wrapped here:

* ``megatron.training.training.train``: finds the peak once at start (``adaptor.throughput``:
  the flag, the device-name table, or a short matmul measured on CPU) and prints where it came from;
* ``megatron.training.training.training_log``: notes the iteration; afterwards writes ``mfu`` to
  TensorBoard and wandb where those are on;
* ``megatron.training.one_logger_utils.track_e2e_metrics``: reads the throughput Megatron computed;
* ``megatron.training.training.print_rank_last``: adds "MFU: x % |" after the throughput field.
"""
from __future__ import annotations

from adaptor.features import ArgumentError, Feature
from adaptor.log import notice

OWNER = __name__
FIELD = " throughput per GPU (TFLOP/s/GPU): "
_state: dict = {"peak": None, "throughput": None, "iteration": None, "first": False}


def _train(wrapped, instance, call_args, kwargs):
    from megatron.training import get_args

    from adaptor import run_state, throughput

    peak = throughput.find_peak(get_args(), run_state.backend().device_type)
    _state["peak"] = peak
    if peak.tflops:
        notice(f"MFU peak: {peak.source}")
    else:
        notice(f"MFU is not printed: {peak.source}")
    return wrapped(*call_args, **kwargs)


def _training_log(wrapped, instance, call_args, kwargs):
    _state["throughput"] = None
    _state["iteration"] = call_args[3] if len(call_args) > 3 else kwargs.get("iteration")
    _state["first"] = kwargs.get("is_first_iteration", False)
    result = wrapped(*call_args, **kwargs)
    value = _mfu()
    if value is not None and not _state["first"]:
        from megatron.training.global_vars import get_tensorboard_writer, get_wandb_writer

        writer, wandb_writer = get_tensorboard_writer(), get_wandb_writer()
        if writer:
            writer.add_scalar("mfu", value, _state["iteration"])
        if wandb_writer:
            wandb_writer.log({"mfu": value}, _state["iteration"])
    _state["throughput"] = None
    return result


def _track_e2e_metrics(wrapped, instance, call_args, kwargs):
    value = call_args[1] if len(call_args) > 1 else kwargs.get("throughput")
    if value is not None:
        _state["throughput"] = value
    return wrapped(*call_args, **kwargs)


def _mfu() -> float | None:
    from adaptor.throughput import mfu

    peak = _state["peak"]
    if peak is None or _state["throughput"] is None:
        return None
    return mfu(_state["throughput"], peak)


def _print_rank_last(wrapped, instance, call_args, kwargs):
    message = call_args[0] if call_args else kwargs.get("message")
    value = _mfu()
    if isinstance(message, str) and FIELD in message and value is not None:
        head, tail = message.split(FIELD, 1)
        number, rest = tail.split(" |", 1)
        message = f"{head}{FIELD}{number} | MFU: {100 * value:.2f} % |{rest}"
        return wrapped(message, *call_args[1:], **kwargs) if call_args else wrapped(message=message)
    return wrapped(*call_args, **kwargs)


class Throughput(Feature):
    name = "throughput"
    upstream_flags = ("--log-throughput",)

    def add_arguments(self, group) -> None:
        group.add_argument("--device-peak-tflops", type=float, default=None, dest="device_peak_tflops",
                           help="Peak TFLOP/s of one device in the run's dtype, for the MFU that --log-throughput "
                                "prints (default: a table by device name; measured on CPU).")

    def enabled(self, ctx) -> bool:
        flags = ctx.flags
        return super().enabled(ctx) and bool(getattr(flags, "log_throughput", False)
                                             or getattr(flags, "device_peak_tflops", None) is not None)

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.training.training.train", _train, OWNER)
        pm.register_wrapper("megatron.training.training.training_log", _training_log, OWNER)
        pm.register_wrapper("megatron.training.one_logger_utils.track_e2e_metrics", _track_e2e_metrics, OWNER)
        pm.register_wrapper("megatron.training.training.print_rank_last", _print_rank_last, OWNER)

    def validate(self, args, ctx) -> None:
        if not args.log_throughput:
            raise ArgumentError("--device-peak-tflops is the peak for the MFU that --log-throughput prints; "
                                "add --log-throughput")
        if args.device_peak_tflops is not None and args.device_peak_tflops <= 0:
            raise ArgumentError(f"--device-peak-tflops {args.device_peak_tflops:g}: give the device's peak "
                                f"TFLOP/s, a positive number")
