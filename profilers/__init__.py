"""Each framework's own profiler and matrix product, one module per framework (torch.py, jax.py, mxnet.py, keras.py),
each with `record(cfg, folder, rank)` and `matmul(cfg, n, dtype)` (common/backend.py's Profiling): what a backend
records a run's --profile steps with and times its measured peak with (its BACKEND takes the module as it is), and
what the framework's idiom (benchmarks/idioms/) records its profiled steps with, so both sides of a parity row are
traced the same way. They import their framework and common/, nothing of the backends, the idioms or the harness;
the trace they write is read by common/profiling.py."""
