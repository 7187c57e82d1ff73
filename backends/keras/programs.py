"""The distribution strategy's Keras model, optimizer and compiled programs, made once per process for what they
are built for.

jax.jit keeps the executables it compiles inside one function object, so a trainer that jitted its own step would
compile it again, although a trainer built for the same model, BatchNorm mode, precision, dtype, data format,
learning rate, batch and devices runs the very same programs (as backends/jax/programs.py). The programs are
stateless: the state is their argument, so trainers that share them share no weights. The model's variables are
only the template the state is copied from (reset) and read back by (canonical), one trainer at a time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import keras
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from backends.keras import models
from backends.xla import program_key
from common.config import RunConfig

# The stateless step's (trainable, non-trainable, optimizer) state is donated: XLA writes the new state into the
# old one's buffers (it is replaced by the step's outputs and never read again).
DONATED = (0, 1, 2)
# The update's (optimizer variables, gradients, trainable) arguments: the optimizer state and the trainable
# variables, for the same reason; the kept gradients stay readable by canonical_gradients().
UPDATE_DONATED = (0, 2)


@dataclass
class Programs:
    distribution: keras.distribution.DataParallel
    model: keras.Model
    optimizer: keras.optimizers.SGD
    mesh: jax.sharding.Mesh
    replicated: NamedSharding  # of the variables, their gradients and the step's metrics
    step: object  # (trainable, statistics, optimizer, x, y) -> (the three, (loss sum, correct))
    # (trainable, statistics, x, y) -> (grads, (new statistics, loss sum, correct))
    gradients: object
    update: object  # (optimizer, grads, trainable) -> (trainable, optimizer)
    predict: object  # (trainable, statistics, x) -> classes


# Programs by what they were built for.
_SHARED: dict[tuple, Programs] = {}


def shared(cfg: RunConfig, dtype: str, devices: list, policy, data_format: str) -> Programs:
    """The programs of a distribution trainer for `cfg` on `devices`, computing in `dtype` with the dtype `policy`
    and `data_format`: built the first time only."""
    key = program_key(cfg, dtype, devices, data_format, DONATED, UPDATE_DONATED)
    if key not in _SHARED:
        _SHARED[key] = build(cfg, devices, policy, data_format)
    return _SHARED[key]


def build(cfg: RunConfig, devices: list, policy, data_format: str) -> Programs:
    distribution = keras.distribution.DataParallel(devices=devices)
    with distribution.scope():
        model = models.build(
            cfg.model, policy, data_format, bn_groups=1 if cfg.bn == "sync" else cfg.devices
        )
        optimizer = keras.optimizers.SGD(learning_rate=cfg.lr)
        optimizer.build(model.trainable_variables)
    mesh = distribution.get_data_layout((cfg.devices,)).backend_layout.mesh
    r = NamedSharding(mesh, P())
    gradients = functools.partial(stateless_gradients, model, cfg.batch_size)
    return Programs(
        distribution,
        model,
        optimizer,
        mesh,
        r,
        step=jax.jit(
            functools.partial(stateless_step, gradients, optimizer),
            out_shardings=(r, r, r, (r, r)),
            donate_argnums=DONATED,
        ),
        gradients=jax.jit(gradients, out_shardings=(r, (r, r, r))),
        update=jax.jit(
            optimizer.stateless_apply, out_shardings=(r, r), donate_argnums=UPDATE_DONATED
        ),
        predict=jax.jit(functools.partial(stateless_classes, model)),
    )


def stateless_gradients(model, batch_size, trainable, statistics, x, y):
    """The gradient of the global mean loss with respect to the replicated variables;
    (grads, (new BatchNorm statistics, loss sum, correct))."""

    def mean_loss(trainable):
        logits, new_statistics = model.stateless_call(trainable, statistics, x, training=True)
        logits = keras.ops.cast(logits, jax.numpy.promote_types(logits.dtype, jax.numpy.float32))
        losses = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
        loss_sum = keras.ops.sum(losses)
        correct = keras.ops.sum(keras.ops.cast(keras.ops.argmax(logits, axis=-1) == y, "int32"))
        return loss_sum / batch_size, (new_statistics, loss_sum, correct)

    return jax.grad(mean_loss, has_aux=True)(trainable)


def stateless_step(gradients, optimizer, trainable, statistics, optimizer_variables, x, y):
    """gradients, then the optimizer's update, in one program."""
    grads, (statistics, loss_sum, correct) = gradients(trainable, statistics, x, y)
    trainable, optimizer_variables = optimizer.stateless_apply(
        optimizer_variables, grads, trainable
    )
    return trainable, statistics, optimizer_variables, (loss_sum, correct)


def stateless_classes(model, trainable, statistics, x):
    logits, _ = model.stateless_call(trainable, statistics, x, training=False)
    return keras.ops.argmax(logits, axis=-1)
