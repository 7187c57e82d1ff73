"""Each framework's own profiler and matrix product, one module per framework (torch.py, jax.py, mxnet.py): what a
backend's profiling.py records a run's --profile steps with and times its measured peak with, and what the
framework's idiom (benchmarks/idioms/) records its profiled steps with, so both sides of a parity row are traced the
same way. They import their framework and common/, nothing of the backends, the idioms or the harness; the trace
they write is read by common/profiling.py."""
