"""JAX backend: pmap and sharding (strategies.py) in JAX, flax (linen) and optax. What a backend is:
common/backend.py; docs/ARCHITECTURE.md.

Simulated devices: without GPUs, a run uses the first N of the CPU devices XLA is asked
for here: a training run's own count (common.worker.DEVICES_ENV), else the most --gpus
may ask for. The flag is read once, when jax initialises its CPU backend, so it is set
before anything in this package imports jax (a count already in XLA_FLAGS is kept). It
changes nothing on the GPUs.
"""

from common.worker import ask_xla_for_cpu_devices

ask_xla_for_cpu_devices()

from backends.jax import distributed, environment, models, parallel, strategies  # noqa: E402
from common.backend import Backend, Switches  # noqa: E402
from profilers import jax as profiler  # noqa: E402

# XLA's matmul precision as --precision says, before each trainer is built; jax_enable_x64 while a float64
# probe computes (without it JAX makes float64 arrays float32)
SWITCHES = Switches(environment.configure_precision, environment.computing_in)
BACKEND = Backend("jax", models, parallel, strategies, environment, distributed, profiler, SWITCHES)
