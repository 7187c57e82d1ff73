"""Keras 3's idiom: d2l's ResNet-18 from stock `keras.layers` in the functional API, as keras.io's
"The Functional API" guide builds its toy ResNet (keras.Input, Conv2D, layers.add, Model(inputs,
outputs)) and compiles it, here with `keras.optimizers.SGD` and
`SparseCategoricalCrossentropy(from_logits=True)`; each step one `model.train_on_batch` (keras.io's
Model training APIs), Keras's own compiled train step. It runs on the framework KERAS_BACKEND names
(jax unless set), in Keras's default data format, channels_last: `feed` transposes the NCHW batches.

    KERAS_BACKEND=jax python -m benchmarks.idioms.keras --config run.json --result idiom.json
"""

from __future__ import annotations

import importlib
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras
import numpy as np
from keras import layers

from benchmarks.idioms import driver
from profilers import keras as profiler

BACKEND = keras.backend.backend()
FRAMEWORK = f"keras {keras.__version__} on {BACKEND} {importlib.import_module(BACKEND).__version__}"


def layer_name(canonical: str) -> str:
    """A layer's name: its canonical prefix, "-" for "." (torch refuses dots in parameter names)."""
    return canonical.replace(".", "-")


# The kernels start from zeros: `load` gives every layer its weights before any step. Keras's default
# (Glorot-uniform) compiles one jax program per kernel shape, 8 of a ResNet-18's 8.5 s build on one CPU core.
KERNEL_INIT = "zeros"


def conv(x, filters, kernel, strides, name):
    """A conv padded as torch pads it, kernel // 2 on every side: Keras's "same" pads a stride-2
    conv on the bottom and right only, so that one is padded explicitly."""
    padding = "same"
    if strides > 1 and kernel > 1:
        x = layers.ZeroPadding2D(kernel // 2)(x)
        padding = "valid"
    return layers.Conv2D(
        filters,
        kernel,
        strides,
        padding=padding,
        kernel_initializer=KERNEL_INIT,
        name=layer_name(name),
    )(x)


def batch_norm(x, name):
    # torch's BatchNorm2d: running <- 0.9 * running + 0.1 * batch, and epsilon 1e-5 (Keras's: 1e-3).
    return layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name=layer_name(name))(x)


def residual(x, channels, strides, name):
    """d2l's residual block (d2l.Residual), with the 1x1 conv3 shortcut where it downsamples."""
    y = layers.ReLU()(batch_norm(conv(x, channels, 3, strides, f"{name}.conv1"), f"{name}.bn1"))
    y = batch_norm(conv(y, channels, 3, 1, f"{name}.conv2"), f"{name}.bn2")
    if strides != 1:
        x = conv(x, channels, 1, strides, f"{name}.conv3")
    return layers.ReLU()(layers.Add()([y, x]))


def resnet18(num_classes=10, in_channels=1):
    """d2l's resnet18 for 28x28 images: no max-pool, stages 2-4 halve the size."""
    inputs = keras.Input(shape=(None, None, in_channels))
    x = layers.ReLU()(batch_norm(conv(inputs, 64, 3, 1, "conv"), "bn"))
    for stage, channels in enumerate((64, 128, 256, 512), start=1):
        x = residual(x, channels, 1 if stage == 1 else 2, f"stage{stage}.0")
        x = residual(x, channels, 1, f"stage{stage}.1")
    x = layers.GlobalAveragePooling2D()(x)
    logits = layers.Dense(num_classes, kernel_initializer=KERNEL_INIT, name="fc")(x)
    return keras.Model(inputs, logits, name="resnet18")


def keras_weights(layer, params: dict) -> list:
    """A layer's canonical parameters in Keras's order and layouts (kernels HWIO, (in, out))."""
    if isinstance(layer, layers.BatchNormalization):
        return [params[k] for k in ("weight", "bias", "running_mean", "running_var")]
    kernel = params["weight"]
    return [kernel.transpose(2, 3, 1, 0) if kernel.ndim == 4 else kernel.T, params["bias"]]


def load(model: keras.Model, weights: dict) -> None:
    by_layer: dict[str, dict] = {}
    for key, value in weights.items():
        prefix, param = key.rsplit(".", 1)
        by_layer.setdefault(layer_name(prefix), {})[param] = value
    with_weights = {layer.name for layer in model.layers if layer.weights}
    if with_weights != set(by_layer):
        raise ValueError(f"weights do not fit the network: {with_weights ^ set(by_layer)}")
    for name, params in by_layer.items():
        layer = model.get_layer(name)
        layer.set_weights(keras_weights(layer, params))


def compute_in_float64() -> None:
    """For the float64 equivalence test only. JAX makes float64 arrays float32 without
    jax_enable_x64, and Keras's type promotion (keras.src.backend.common.dtypes) makes 64-bit
    results 32-bit outside TensorFlow, so that ops.mean (BatchNormalization, GlobalAveragePooling2D)
    and, on torch, ops.matmul (Dense) compute in float32: undone in its table (no public switch)."""
    from keras.src.backend.common import dtypes

    if BACKEND == "jax":
        import jax

        jax.config.update("jax_enable_x64", True)
    dtypes.BIT64_TO_BIT32_DTYPE["float64"] = "float64"


def training_step(weights: dict, lr: float, dtype: str, device_kind: str):
    if dtype == "float64":
        compute_in_float64()
    keras.config.set_floatx(dtype)  # the variables', the learning rate's and the layers' dtype
    model = resnet18()
    load(model, weights)
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=lr),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )

    def feed(batches: list):
        """Each batch a tensor on the default device (the GPU if any), NCHW -> Keras's NHWC: what
        train_on_batch takes. `fit`'s own feeding (its epoch iterator over arrays or a dataset) runs inside
        the call, so it cannot be put before a step's timer (docs/parity.md)."""
        for x, y in batches:
            yield (
                keras.ops.convert_to_tensor(np.transpose(x, (0, 2, 3, 1))),
                keras.ops.convert_to_tensor(y),
            )

    def step(batch) -> float:
        # train_on_batch resets the loss tracker first: it returns this step's loss (its forward
        # pass, before the update) as a Python float, the host reading it the sync.
        return float(model.train_on_batch(*batch))

    return feed, step


def record(cfg, folder):
    """The profiler of the framework Keras runs on around the profiled steps, as the keras backend's runs on it
    are recorded."""
    return profiler.record(cfg, folder, 0)


if __name__ == "__main__":
    sys.exit(driver.main(sys.modules[__name__]))
