"""JAX's idiom: d2l's ResNet-18 in flax.linen's stock layers (`nn.Conv`, `nn.BatchNorm`, `nn.Dense`, NHWC),
trained the way flax's ImageNet example trains (github.com/google/flax, examples/imagenet/train.py:
`train_step`): a `TrainState` that carries `batch_stats`, `jax.value_and_grad` of the loss with
`mutable=["batch_stats"]`, `optax.softmax_cross_entropy_with_integer_labels`, `state.apply_gradients`, the
step under `jax.jit` with the state donated; plain `optax.sgd`; the batches fed as that example feeds them
(`create_input_iter`: `jax_utils.prefetch_to_device(it, 2)`), a queue of two batches put on the device ahead of
their steps.

    python -m benchmarks.idioms.jax --config run.json --result idiom.json
"""

from __future__ import annotations

import collections
import itertools
import sys
from functools import partial
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax import traverse_util
from flax.training import train_state

from benchmarks.idioms import driver
from profilers import jax as profiler

FRAMEWORK = f"jax {jax.__version__} (flax {flax.__version__}, optax {optax.__version__})"

PREFETCH = 2  # batches put ahead of their step: flax's ImageNet example's

# torch's symmetric padding=1 of the 3x3 convs: "SAME" would pad stride-2 convs on the far side only
PAD = ((1, 1), (1, 1))


def layers(dtype, train: bool):
    """Conv and BatchNorm in `dtype`, BatchNorm with torch's momentum and epsilon."""
    conv = partial(nn.Conv, dtype=dtype, param_dtype=dtype)
    norm = partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, epsilon=1e-5)
    return conv, partial(norm, dtype=dtype, param_dtype=dtype)


class Residual(nn.Module):
    """d2l's residual block (d2l.Residual)."""

    channels: int
    use_1x1conv: bool = False
    strides: int = 1
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool = True):
        conv, norm = layers(self.dtype, train)
        y = conv(self.channels, (3, 3), self.strides, padding=PAD, name="conv1")(x)
        y = nn.relu(norm(name="bn1")(y))
        y = norm(name="bn2")(conv(self.channels, (3, 3), padding=PAD, name="conv2")(y))
        if self.use_1x1conv:
            x = conv(self.channels, (1, 1), self.strides, padding="VALID", name="conv3")(x)
        return nn.relu(y + x)


class ResNet18(nn.Module):
    """d2l's resnet18 for 28x28 images: no max-pool; the first block of stages 2-4 halves the size."""

    num_classes: int = 10
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool = True):
        conv, norm = layers(self.dtype, train)
        x = nn.relu(norm(name="bn")(conv(64, (3, 3), padding=PAD, name="conv")(x)))
        for stage, channels in enumerate((64, 128, 256, 512), start=1):
            for i in range(2):
                down = stage > 1 and i == 0
                name = f"stage{stage}_{i}"
                x = Residual(channels, down, 2 if down else 1, self.dtype, name=name)(x, train)
        x = jnp.mean(x, axis=(1, 2))  # global average pool
        return nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=self.dtype, name="fc")(x)


def flax_entry(canonical: str, array: np.ndarray) -> tuple[tuple, np.ndarray]:
    """A canonical parameter's flax path and value: stageN.i.conv1.weight -> params/stageN_i/conv1/kernel;
    conv OIHW -> HWIO, dense (out, in) -> (in, out), BN weight -> scale, running stats -> batch_stats."""
    *module, leaf = canonical.split(".")
    if module[0].startswith("stage"):
        module = [f"{module[0]}_{module[1]}", *module[2:]]
    if leaf.startswith("running_"):
        return ("batch_stats", *module, leaf.removeprefix("running_")), array
    if leaf == "weight" and array.ndim == 1:
        leaf = "scale"
    elif leaf == "weight":
        leaf, array = "kernel", array.T if array.ndim == 2 else array.transpose(2, 3, 1, 0)
    return ("params", *module, leaf), array


def load(model: nn.Module, weights: dict, dtype) -> dict:
    """The flax variables ({"params", "batch_stats"}) of the canonical weights, checked against the model."""
    variables = dict(flax_entry(k, v) for k, v in weights.items())
    shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 28, 28, 1), dtype))
    expected = {k: v.shape for k, v in traverse_util.flatten_dict(shapes).items()}
    if expected != {k: v.shape for k, v in variables.items()}:
        raise ValueError("weights do not fit the network")
    return traverse_util.unflatten_dict(variables)


class TrainState(train_state.TrainState):
    batch_stats: Any


@partial(jax.jit, donate_argnums=0)
def train_step(state: TrainState, batch):
    images, labels = batch

    def loss_fn(params):
        variables = {"params": params, "batch_stats": state.batch_stats}
        logits, updates = state.apply_fn(variables, images, mutable=["batch_stats"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return loss, updates

    (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    return state.apply_gradients(grads=grads, batch_stats=updates["batch_stats"]), loss


def training_step(weights: dict, lr: float, dtype: str, device_kind: str):
    if dtype == "float64":
        jax.config.update("jax_enable_x64", True)  # before any array exists, or they stay float32
    device = jax.devices("cpu")[0] if device_kind == "cpu" else jax.devices()[0]
    model = ResNet18(dtype=jnp.dtype(dtype))
    variables = load(model, weights, dtype)
    state = TrainState.create(
        apply_fn=model.apply,
        params=variables["params"],
        batch_stats=variables["batch_stats"],
        tx=optax.sgd(lr),
    )
    # all of the state on the device, its step count too: the steps' outputs are, and a state placed
    # otherwise than they are would compile the step a second time, inside the timed steps
    state = jax.device_put(state, device)

    def feed(batches: list):
        """flax's prefetch_to_device(it, 2) for one device: that helper stacks each batch along a leading
        axis of devices, for a pmapped step; this step is jitted on one device, so each batch is one
        jax.device_put. The next batches' copies are queued before a step's, and run while it does."""
        it = ((np.transpose(x, (0, 2, 3, 1)), y) for x, y in batches)  # NCHW -> flax's NHWC
        queue = collections.deque()

        def enqueue(n):
            for batch in itertools.islice(it, n):
                queue.append(jax.device_put(batch, device))

        enqueue(PREFETCH)
        while queue:
            yield queue.popleft()
            enqueue(1)

    def step(batch) -> float:
        nonlocal state
        state, loss = train_step(state, batch)
        return float(loss)

    return feed, step


def record(cfg, folder):
    """jax.profiler around the profiled steps, as the jax backend's runs are recorded."""
    return profiler.record(cfg, folder, 0)


if __name__ == "__main__":
    sys.exit(driver.main(sys.modules[__name__]))
