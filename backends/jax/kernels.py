"""What jax's CPU kernels run with: the portable test pass's probe (backend.toml's [kernels_probe], run by
harness/suites/kernels.py as a script, with XLA's verbose logging). One compiled function makes XLA's CPU compiler say
where its code generation is capped; the `probe:` line says the flags XLA took and the CPUs its thread pool spans."""

import os

import jax
import jax.numpy as jnp

jax.jit(lambda a: jnp.tanh(a).sum())(jnp.ones(64)).block_until_ready()
print(
    f"probe: XLA_FLAGS accepted ({os.environ.get('XLA_FLAGS')}); the XLA thread pool spans "
    f"{len(os.sched_getaffinity(0))} usable CPU(s): "
    f"jaxlib {jax.__version__} has no thread-count switch"
)
