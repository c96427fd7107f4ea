"""An asynchronous torch_dist save stages host tensors as copies, so training on cannot change what
is written.

In this process set up as a one-rank training run (the model_parallel fixture), Megatron's
``FileSystemWriterAsync`` gets a bucket holding a live host tensor; the test takes the staging
function the async caller would run, stages, then changes the live tensor in place as the next
optimizer step does. The staged tensor must keep the old values. The same is checked against
upstream's own ``preload_tensors``, which hands back the live tensor: the fault this patch fixes,
and the sign that it is still needed.
"""
from __future__ import annotations


def test_staged_host_tensors_do_not_follow_the_live_ones(model_parallel, tmp_path):
    import torch
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync

    writer = FileSystemWriterAsync(str(tmp_path), thread_count=1)
    live = torch.arange(6, dtype=torch.float32)
    writer.write_buckets = [(str(tmp_path / "__0_0.distcp"), "__0_0.distcp", ([], [("exp_avg", live)]))]
    save_fn, stage, _ = writer.get_save_function_and_args()

    def staged_after_a_step(staging):
        staged = staging()[0][2][1][0][1]
        before = live.tolist()
        live.add_(100.0)  # the trainer's next step, while the writer writes
        return before, staged.tolist()

    before, staged = staged_after_a_step(stage)
    assert staged == before == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    before, staged = staged_after_a_step(lambda: FileSystemWriterAsync.preload_tensors(writer.write_buckets, False))
    assert staged == [x + 100.0 for x in before]  # upstream's staging: the live tensor itself
    assert save_fn.func is FileSystemWriterAsync.write_preloaded_data_multithread
