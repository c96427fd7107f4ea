"""Memory without Transformer Engine: recomputation, activation offload and optimizer offload.

Each feature here trades time for device memory and leaves the numbers a run computes unchanged;
the tests hold each one to the loss curve of the same run without it."""
