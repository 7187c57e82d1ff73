"""The Keras-on-jax strategies' model, optimizer and compiled programs (distribution's and fsdp's), made once per
process for what they are built for.

jax.jit keeps the executables it compiles inside one function object, so a trainer that jitted its own step would
compile it again, although a trainer built for the same strategy, model, BatchNorm mode, precision, dtype, data
format, learning rate, batch and devices runs the very same programs (as backends/jax/programs.py). The programs
are stateless: the state is their argument, so trainers that share them share no weights. The model's variables
are only the template the state is copied from (reset) and read back by (canonical), one trainer at a time.

The two strategies differ only in their keras.distribution, and so in the trainable variables' layout: DataParallel
replicates them; fsdp's ModelParallel shards each over the same one-axis mesh that splits the batch (fully_sharded),
and its step gathers them whole where the model reads them (gathered).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import jax
import keras
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from backends.keras import models
from backends.xla import program_key
from common.config import RunConfig

# The mesh's one axis, as keras.distribution.DataParallel names it: the batch is split along it, and fsdp shards the
# variables along it too.
BATCH_AXIS = "batch"
# The stateless step's (trainable, non-trainable, optimizer) state is donated: XLA writes the new state into the
# old one's buffers (it is replaced by the step's outputs and never read again).
DONATED = (0, 1, 2)
# The update's (optimizer variables, gradients, trainable) arguments: the optimizer state and the trainable
# variables, for the same reason; the kept gradients stay readable by canonical_gradients().
UPDATE_DONATED = (0, 2)


@dataclass
class Programs:
    distribution: keras.distribution.Distribution  # DataParallel, or fsdp's ModelParallel
    model: keras.Model
    optimizer: keras.optimizers.SGD
    mesh: jax.sharding.Mesh
    replicated: NamedSharding  # of the statistics, the optimizer's variables and the step's metrics
    # the trainable variables' layout as the programs take and give them, their gradients' too: `replicated`
    # (DataParallel), or each variable's sharding (fsdp)
    trainable: object
    step: object  # (trainable, statistics, optimizer, x, y) -> (the three, (loss sum, correct))
    # (trainable, statistics, x, y) -> (grads, (new statistics, loss sum, correct))
    gradients: object
    update: object  # (optimizer, grads, trainable) -> (trainable, optimizer)
    predict: object  # (trainable, statistics, x) -> classes


# Programs by what they were built for.
_SHARED: dict[tuple, Programs] = {}


def shared(cfg: RunConfig, dtype: str, devices: list, policy, data_format: str) -> Programs:
    """The programs of a distribution or fsdp trainer for `cfg` on `devices`, computing in `dtype` with the dtype
    `policy` and `data_format`: built the first time only."""
    key = program_key(cfg, dtype, devices, data_format, DONATED, UPDATE_DONATED, cfg.strategy)
    if key not in _SHARED:
        _SHARED[key] = build(cfg, devices, policy, data_format)
    return _SHARED[key]


def build(cfg: RunConfig, devices: list, policy, data_format: str) -> Programs:
    sharded = cfg.strategy == "fsdp"
    distribution = (
        fully_sharded(cfg, devices, policy, data_format)
        if sharded
        else keras.distribution.DataParallel(devices=devices)
    )
    with distribution.scope():
        model = models.build(
            cfg.model, policy, data_format, bn_groups=1 if cfg.bn == "sync" else cfg.devices
        )
        optimizer = keras.optimizers.SGD(learning_rate=cfg.lr)
        optimizer.build(model.trainable_variables)
    mesh = distribution.get_data_layout((cfg.devices,)).backend_layout.mesh
    r = NamedSharding(mesh, P())
    trainable = [v.value.sharding for v in model.trainable_variables] if sharded else r
    whole = functools.partial(gathered, whole_layouts(model, distribution)) if sharded else as_held
    gradients = functools.partial(stateless_gradients, model, cfg.batch_size, whole)
    return Programs(
        distribution,
        model,
        optimizer,
        mesh,
        r,
        trainable,
        step=jax.jit(
            functools.partial(stateless_step, gradients, optimizer),
            out_shardings=(trainable, r, r, (r, r)),
            donate_argnums=DONATED,
        ),
        gradients=jax.jit(gradients, out_shardings=(trainable, (r, r, r))),
        update=jax.jit(
            optimizer.stateless_apply, out_shardings=(trainable, r), donate_argnums=UPDATE_DONATED
        ),
        predict=jax.jit(functools.partial(stateless_classes, model)),
    )


def fully_sharded(
    cfg: RunConfig, devices: list, policy, data_format: str
) -> keras.distribution.ModelParallel:
    """fsdp's distribution, ZeRO-3 in Keras's own API: a mesh of one axis, the batch axis, over the devices (the
    batch split along it as DataParallel splits it), and a LayoutMap that shards every trainable variable along
    the same axis (sharded_axes). The BatchNorm running statistics and the optimizer's variables match no key:
    replicated. Keras lays a variable out as it makes it, so the map is keyed by the paths and shapes of a model
    built first outside any distribution."""
    mesh = keras.distribution.DeviceMesh((len(devices),), [BATCH_AXIS], devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    template = models.build(cfg.model, policy, data_format)
    for variable in template.trainable_variables:
        # (a key is a regular expression, matched whole)
        layout_map[re.escape(variable.path)] = sharded_axes(variable.shape, len(devices))
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name=BATCH_AXIS)


def sharded_axes(shape: tuple, devices: int) -> tuple:
    """A variable's layout axes: sharded over the devices along its largest dimension they divide (the first of
    equal ones; a kernel's channels or features, never its 3 x 3 window), so that every device holds an equal
    shard; replicated where they divide none (a 10-class bias on 4 devices)."""
    divisible = [axis for axis, size in enumerate(shape) if size % devices == 0]
    axes = [None] * len(shape)
    if divisible:
        axes[max(divisible, key=lambda axis: shape[axis])] = BATCH_AXIS
    return tuple(axes)


def whole_layouts(model: keras.Model, distribution) -> list:
    """Every trainable variable's replicated layout: where fsdp's step reads it whole."""
    return [
        keras.distribution.TensorLayout([None] * len(v.shape), distribution.device_mesh)
        for v in model.trainable_variables
    ]


def gathered(layouts: list, trainable: list) -> list:
    """The sharded variables laid out whole, inside the step (Keras's distribute_tensor, a sharding constraint):
    XLA all-gathers each where the model reads it (once a step in XLA's CPU program: the backward reuses it), and
    reduce-scatters its gradient to the shards (on the CPU as an all-reduce and each device's slice). Left to
    itself, XLA moved activations between the devices instead, to use LeNet's dense kernels where their shards
    lie (all-to-alls, gathered activation gradients): other parallelism than data parallelism."""
    return [
        keras.distribution.distribute_tensor(w, layout) for w, layout in zip(trainable, layouts)
    ]


def as_held(trainable: list) -> list:
    """The replicated variables as they are (DataParallel)."""
    return trainable


def stateless_gradients(model, batch_size, whole, trainable, statistics, x, y):
    """The gradient of the global mean loss with respect to the variables, the model reading them `whole`;
    (grads, (new BatchNorm statistics, loss sum, correct))."""

    def mean_loss(trainable):
        logits, new_statistics = model.stateless_call(
            whole(trainable), statistics, x, training=True
        )
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
