"""The compiled programs of the jax trainers, and what they donate.

jax.jit (and jax.pmap) keep the executables they compile inside one function object, so a trainer that made
new closures would compile its whole step again, although a trainer built for the same model, BatchNorm mode,
precision, dtype, learning rate, batch and devices runs the very same programs. `shared` makes them once per
process for each such key: a check, or a test module that builds many trainers, compiles each program once.
A run builds one trainer, and keeps the one set it compiles.
"""

from __future__ import annotations

from typing import Callable

import optax

from backends.jax import models
from backends.jax.environment import module_dtypes
from backends.jax.parallel import AXIS
from backends.xla import program_key
from common.config import RunConfig

# The step's (params, batch_stats, opt_state) arguments are donated: XLA writes the new state into the old
# one's buffers instead of allocating a second copy of the model every step (the state is replaced by the
# step's outputs and never read again).
DONATED = (0, 1, 2)
# update()'s (params, opt_state) arguments, for the same reason. The kept gradients are not donated: they
# stay readable by canonical_gradients() until the next reduce_gradients(), step() or reset().
UPDATE_DONATED = (0, 1)

# (net, optimizer, {attribute name: compiled program}) by what they were built for.
_SHARED: dict[tuple, tuple] = {}


def shared(kind: str, cfg: RunConfig, dtype: str, devices: list, build: Callable) -> tuple:
    """(net, optimizer, programs) of a `kind` trainer for `cfg` on `devices`, computing in `dtype`:
    build(net, optimizer, cfg) -> {name: program} is called the first time only."""
    key = program_key(cfg, dtype, devices, kind, DONATED, UPDATE_DONATED)
    if key not in _SHARED:
        net = models.build(
            cfg.model,
            bn_axis=AXIS if cfg.bn == "sync" else None,
            **module_dtypes(cfg.levers.precision, dtype),
        )
        tx = optax.sgd(cfg.lr)
        _SHARED[key] = (net, tx, {"_predict": models.predict_classes(net), **build(net, tx, cfg)})
    return _SHARED[key]
