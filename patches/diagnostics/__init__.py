"""What a run reports, and how a stalled one ends: memory, throughput and MFU, TensorBoard memory,
profiler traces, CPU precision, collective timeouts."""
