"""ResNet-18 (d2l's variant for 28x28 inputs), d2l's from-scratch LeNet and ResNet-50 (torchvision's v1.5), from
keras.layers (Keras 3's functional API), the same code on either framework Keras runs on here (torch in the ddp
ranks, jax otherwise). The ResNets pool globally and take square images of any side (ResNet-18's from 8, ResNet-50's
from 32: their input's spatial dims are None, as a torch module takes any size): one model for every --image-size,
the step compiled for the size it is given. LeNet's dense layers fix its input at 28 x 28.

Layer names are the canonical module names (common/architectures.py) with "-" for "." (torch, under Keras,
refuses dots in parameter names): layer `stage2-0-conv3` holds canonical `stage2.0.conv3.weight` and `.bias`
(ResNet-50's convs have no bias: use_bias=False, and no canonical `.bias`).
Layouts differ from the canonical ones and are converted here:
  Conv2D kernel  (kh, kw, in, out)          <->  canonical OIHW (out, in, kh, kw)
  Dense kernel   (in, out)                  <->  canonical (out, in)
  BatchNorm      gamma, beta, moving_mean,  <->  weight, bias, running_mean, running_var
                 moving_variance
Data format: channels_last (NHWC), Keras's own default (environment.DATA_FORMAT): the canonical NCHW batches are
transposed to it (`to_data_format`). `build` makes channels_first models too; the kernels' layout is the same in
both.
Dtype policy (`policy`): "float32"; "mixed_bfloat16" for --precision bf16 (variables and SGD in float32, the
layers compute in bfloat16); "float64" for the equivalence API's float64 calls.
BatchNorm is this module's subclass of keras.layers.BatchNormalization (see BatchNorm): Keras's defaults are
not torch's (momentum 0.99 and epsilon 1e-3; its running variance takes the biased batch variance).
"""

from __future__ import annotations

import keras
import numpy as np
from keras import layers, ops

from backends.keras.environment import DATA_FORMAT, POLICIES, computing_in
from common import architectures
from common.architectures import RESNET50_LAYERS

BN_EPS = 1e-5


class Unset(keras.initializers.Initializer):
    """Every weight's value before load_canonical gives it the canonical one, which every network is given before it
    computes: zeros made by numpy. Keras's own initializers would only cost time: on jax each is a program compiled
    for each shape, 4 to 10 s of the first build of a model in a process."""

    def __call__(self, shape, dtype=None):
        return np.zeros(shape, keras.backend.standardize_dtype(dtype))


UNSET = Unset()
BN_UNSET = {
    f"{weight}_initializer": UNSET for weight in ("gamma", "beta", "moving_mean", "moving_variance")
}
# torch's convention: running <- 0.9 * running + 0.1 * batch (Keras's momentum=0.9)
BN_MOMENTUM = 0.1


def policy(precision: str, dtype: str) -> str:
    """The Keras dtype policy of a run's layers: float64 throughout for a float64 call, else --precision's."""
    return "float64" if dtype == "float64" else POLICIES[precision]


# Keras 3 computes some ops' float64 results in float32 outside TensorFlow: its dtype promotion
# (keras.src.backend.common.dtypes) forces 64-bit results to 32 bits, which ops.mean (jax and torch) and ops.matmul
# (torch) apply to their float64 inputs. The layers below therefore take means as ops.sum / count and products
# with ops.einsum, which keep their operands' dtype, so that a float64 run computes in float64 throughout (the
# float64 proof needs it); in float32 and bfloat16 they compute what the stock layers compute. (Max-pooling,
# convolution and zero padding keep their input's dtype: the stock layers serve.)


def _mean(x, axes):
    """The mean over `axes` (kept), in x's dtype (see above)."""
    return ops.sum(x, axis=axes, keepdims=True) / int(np.prod([x.shape[a] for a in axes]))


class BatchNorm(layers.BatchNormalization):
    """keras.layers.BatchNormalization's weights (gamma, beta, moving_mean, moving_variance) with torch's math.

    Training normalises with the batch's biased variance, as every framework does, and updates the running
    statistics by torch's rule: momentum 0.1 and the UNBIASED variance, var * n / (n - 1), n the values per
    channel the statistics were taken over. `groups` > 1 takes them over each of `groups` equal slices of the
    batch on its own: the devices' shards when one call sees the global batch (the distribution strategy's
    per-device BatchNorm); the running statistics then move by the groups' mean update, which is the average
    that evaluation takes of per-device statistics (the update is linear). groups=1 with a global batch is
    synchronised BatchNorm. Statistics are taken in at least float32 (bfloat16 activations included)."""

    def __init__(self, groups: int = 1, **kwargs):
        super().__init__(momentum=1 - BN_MOMENTUM, epsilon=BN_EPS, **BN_UNSET, **kwargs)
        self.groups = groups

    def call(self, inputs, training=None, mask=None):
        x = inputs
        if x.dtype in ("float16", "bfloat16"):
            x = ops.cast(x, "float32")
        channel = self.axis % len(x.shape)
        if not training:
            return ops.cast(
                self._normalize(x, self.moving_mean, self.moving_variance, channel),
                self.compute_dtype,
            )
        grouped = ops.reshape(x, (self.groups, x.shape[0] // self.groups, *x.shape[1:]))
        # all but the group and channel axes
        axes = tuple(a + 1 for a in range(len(x.shape)) if a != channel)
        count = int(np.prod([grouped.shape[a] for a in axes]))
        if count < 2:
            raise ValueError(
                f"BatchNorm needs more than 1 value per channel in training, got {count}"
            )
        mean = _mean(grouped, axes)
        var = _mean(ops.square(grouped - mean), axes)
        y = ops.reshape(self._normalize(grouped, mean, var, channel + 1), x.shape)
        batch_mean = ops.sum(ops.reshape(mean, (self.groups, -1)), axis=0) / self.groups
        batch_var = (
            ops.sum(ops.reshape(var, (self.groups, -1)), axis=0)
            / self.groups
            * (count / (count - 1))
        )
        m = self.momentum
        for running, batch in ((self.moving_mean, batch_mean), (self.moving_variance, batch_var)):
            # on the variable's tensor (`value`, a stateless call's value in one), not on the Keras variable,
            # whose operators are Keras's ops (see _normalize)
            running.assign(running.value * m + ops.cast(batch, running.dtype) * (1 - m))
        return ops.cast(y, self.compute_dtype)

    def _normalize(self, x, mean, var, channel: int):
        """(x - mean) / sqrt(var + eps) * gamma + beta, the per-channel vectors broadcast along `channel`.

        This layer's Python numbers (eps, the momentum, the counts) meet only the framework's own tensors, through
        its own operators, which take a number as an operand of the kernel. A Keras op, or an operator of a Keras
        variable, would first make each a tensor (on torch, torch.as_tensor on the device: a copy from the host
        that waits, each call); so the variables enter the math as tensors (ops.cast, `value`)."""
        shape = [1] * len(x.shape)
        shape[channel] = -1
        mean, var, gamma, beta = (
            ops.reshape(ops.cast(v, x.dtype), shape) if len(v.shape) == 1 else v
            for v in (mean, var, self.gamma, self.beta)
        )
        return (x - mean) * ops.rsqrt(var + self.epsilon) * gamma + beta


class Dense(layers.Dense):
    """keras.layers.Dense (its kernel and bias) with the product as ops.einsum (see above)."""

    def call(self, inputs, training=None):
        return ops.einsum("...i,io->...o", inputs, ops.cast(self.kernel, inputs.dtype)) + ops.cast(
            self.bias, inputs.dtype
        )


class GlobalAveragePooling2D(layers.GlobalAveragePooling2D):
    """keras.layers.GlobalAveragePooling2D with the mean as ops.sum / count (see above)."""

    def call(self, inputs):
        axes = (2, 3) if self.data_format == "channels_first" else (1, 2)
        return ops.reshape(_mean(inputs, axes), (inputs.shape[0], -1))


def layer_name(module: str) -> str:
    """A canonical module name as a layer name: "stage2.0.conv3" -> "stage2-0-conv3"."""
    return module.replace(".", "-")


class Net:
    """What builds one model: the dtype policy, the data format and BatchNorm's groups, given to every layer."""

    def __init__(self, policy: str = "float32", data_format: str = DATA_FORMAT, bn_groups: int = 1):
        self.policy, self.data_format, self.bn_groups = policy, data_format, bn_groups
        self.channel_axis = 1 if data_format == "channels_first" else -1

    def conv(
        self,
        x,
        name: str,
        filters: int,
        kernel: int,
        stride: int = 1,
        padding: int = 0,
        bias: bool = True,
    ):
        """torch's symmetric padding. A stride-1 conv padded by kernel // 2 is Keras's "same", which the
        framework fuses into the convolution (an explicit pad copies the activations first: 20% of a
        ResNet-18 step on XLA's CPU); Keras's "same" pads a stride-2 conv on one side only, so any other
        padding is explicit."""
        same = stride == 1 and kernel % 2 == 1 and padding == kernel // 2
        x = x if same else self.pad(x, name, padding)
        return layers.Conv2D(
            filters,
            kernel,
            strides=stride,
            padding="same" if same else "valid",
            use_bias=bias,
            data_format=self.data_format,
            kernel_initializer=UNSET,
            bias_initializer=UNSET,
            dtype=self.policy,
            name=layer_name(name),
        )(x)

    def pad(self, x, name: str, padding: int):
        if not padding:
            return x
        return layers.ZeroPadding2D(
            padding, data_format=self.data_format, dtype=self.policy, name=layer_name(f"{name}.pad")
        )(x)

    def bn(self, x, name: str):
        return BatchNorm(
            groups=self.bn_groups, axis=self.channel_axis, dtype=self.policy, name=layer_name(name)
        )(x)

    def relu(self, x):
        return layers.ReLU(dtype=self.policy)(x)

    def dense(self, x, name: str, units: int):
        return Dense(
            units,
            kernel_initializer=UNSET,
            bias_initializer=UNSET,
            dtype=self.policy,
            name=layer_name(name),
        )(x)

    def max_pool(self, x, name: str, size: int, stride: int, padding: int):
        """torch pads a max-pool with -inf; zeros give the same maxima (and gradients) after a ReLU, as
        ResNet-50's one max-pool comes: every window holds a real value >= 0."""
        x = self.pad(x, name, padding)
        return layers.MaxPooling2D(
            size, stride, data_format=self.data_format, dtype=self.policy, name=layer_name(name)
        )(x)

    def global_average_pool(self, x):
        return GlobalAveragePooling2D(data_format=self.data_format, dtype=self.policy)(x)

    def residual(self, x, name: str, channels: int, use_1x1conv: bool = False, stride: int = 1):
        """d2l's residual block: two 3x3 convs with BatchNorm; a 1x1 conv on the shortcut when shape changes."""
        y = self.relu(self.bn(self.conv(x, f"{name}.conv1", channels, 3, stride, 1), f"{name}.bn1"))
        y = self.bn(self.conv(y, f"{name}.conv2", channels, 3, 1, 1), f"{name}.bn2")
        shortcut = self.conv(x, f"{name}.conv3", channels, 1, stride) if use_1x1conv else x
        return self.relu(layers.Add(dtype=self.policy)([y, shortcut]))

    def bottleneck(self, x, name: str, planes: int, stride: int = 1, downsample: bool = False):
        """torchvision's Bottleneck (v1.5: the stride on the 3x3 conv): 1x1, 3x3, 1x1 (4x the planes), bias-free
        convs each followed by BatchNorm; a strided 1x1 conv + BatchNorm (`downsample`) on a changed shortcut."""
        y = self.relu(self.bn(self.conv(x, f"{name}.conv1", planes, 1, bias=False), f"{name}.bn1"))
        y = self.relu(
            self.bn(self.conv(y, f"{name}.conv2", planes, 3, stride, 1, bias=False), f"{name}.bn2")
        )
        y = self.bn(self.conv(y, f"{name}.conv3", 4 * planes, 1, bias=False), f"{name}.bn3")
        if downsample:
            x = self.bn(
                self.conv(x, f"{name}.downsample.0", 4 * planes, 1, stride, bias=False),
                f"{name}.downsample.1",
            )
        return self.relu(layers.Add(dtype=self.policy)([y, x]))

    def inputs(self, in_channels: int = 1, side: int | None = 28):
        """Images of `side` x `side` (None: any side)."""
        shape = (
            (in_channels, side, side)
            if self.data_format == "channels_first"
            else (side, side, in_channels)
        )
        return keras.Input(shape, dtype="float64" if self.policy == "float64" else "float32")

    def resnet18(self, num_classes: int = 10, in_channels: int = 1) -> keras.Model:
        """3x3 stride-1 stem (no max-pool), stages of 64/128/256/512 channels, global average pool, dense. Any image
        side (see the module's docstring)."""
        inputs = self.inputs(in_channels, side=None)
        x = self.relu(self.bn(self.conv(inputs, "conv", 64, 3, 1, 1), "bn"))
        for stage, channels in enumerate((64, 128, 256, 512), start=1):
            first = stage == 1
            x = self.residual(
                x, f"stage{stage}.0", channels, use_1x1conv=not first, stride=1 if first else 2
            )
            x = self.residual(x, f"stage{stage}.1", channels)
        x = self.global_average_pool(x)
        return keras.Model(inputs, self.dense(x, "fc", num_classes), name="resnet18")

    def lenet(self, num_classes: int = 10, in_channels: int = 1) -> keras.Model:
        """The from-scratch chapter's network: conv3x3(20) relu avgpool, conv5x5(50) relu avgpool, 800-128-10."""
        inputs = self.inputs(in_channels)
        x = inputs
        for name, filters, kernel in (("conv1", 20, 3), ("conv2", 50, 5)):
            x = layers.AveragePooling2D(2, data_format=self.data_format, dtype=self.policy)(
                self.relu(self.conv(x, name, filters, kernel))
            )
        if self.data_format == "channels_last":
            # flatten in torch's (C, H, W) order
            x = layers.Permute((3, 1, 2), dtype=self.policy)(x)
        # (as it is: no transpose)
        x = layers.Flatten(data_format="channels_last", dtype=self.policy)(x)
        x = self.relu(self.dense(x, "fc1", 128))
        return keras.Model(inputs, self.dense(x, "fc2", num_classes), name="lenet")

    def resnet50(self, num_classes: int = 1000, in_channels: int = 3) -> keras.Model:
        """torchvision's resnet50, layer for layer: 7x7 stride-2 stem, 3x3 stride-2 max-pool, layer1..layer4 of
        3/4/6/3 bottlenecks, global average pool, dense. Any image side (see the module's docstring)."""
        inputs = self.inputs(in_channels, side=None)
        x = self.relu(self.bn(self.conv(inputs, "conv1", 64, 7, 2, 3, bias=False), "bn1"))
        x = self.max_pool(x, "maxpool", 3, 2, 1)
        for index, (planes, blocks, stride) in enumerate(RESNET50_LAYERS, start=1):
            x = self.bottleneck(x, f"layer{index}.0", planes, stride, downsample=True)
            for block in range(1, blocks):
                x = self.bottleneck(x, f"layer{index}.{block}", planes)
        x = self.global_average_pool(x)
        return keras.Model(inputs, self.dense(x, "fc", num_classes), name="resnet50")


def resnet18(num_classes: int = 10, in_channels: int = 1) -> keras.Model:
    return Net().resnet18(num_classes, in_channels)


def lenet(num_classes: int = 10, in_channels: int = 1) -> keras.Model:
    return Net().lenet(num_classes, in_channels)


def resnet50(num_classes: int = 1000, in_channels: int = 3) -> keras.Model:
    return Net().resnet50(num_classes, in_channels)


def build(
    model: str, policy: str = "float32", data_format: str = DATA_FORMAT, bn_groups: int = 1
) -> keras.Model:
    """The network with the channels and classes of the input it takes (common/architectures.py).
    `bn_groups`: the devices one call's batch spans when BatchNorm normalises per device (see BatchNorm)."""
    net = Net(policy, data_format, bn_groups)
    make = {"resnet18": net.resnet18, "lenet": net.lenet, "resnet50": net.resnet50}[model]
    return make(architectures.num_classes(model), architectures.in_channels(model))


def count_params(model: keras.Model) -> int:
    """Trainable parameters (BatchNorm running statistics are non-trainable variables)."""
    return sum(int(np.prod(v.shape)) for v in model.trainable_variables)


def predict(
    model: str, weights: dict[str, np.ndarray], x: np.ndarray, train: bool, dtype: str
) -> np.ndarray:
    """Logits of `model` with canonical `weights` on a numpy NCHW batch, on one CPU device, in `dtype`
    (common/backend.py); in training mode the running statistics it would update are dropped."""
    with computing_in(dtype), keras.device("cpu:0"):
        net = build(model, policy("fp32", dtype))
        load_canonical(net, weights)
        values = (
            [v.value for v in net.trainable_variables],
            [v.value for v in net.non_trainable_variables],
        )
        x = to_data_format(np.asarray(x, dtype=dtype), DATA_FORMAT)
        logits, _ = net.stateless_call(*values, x, training=train)
        return keras.ops.convert_to_numpy(logits)


def to_data_format(x: np.ndarray, data_format: str) -> np.ndarray:
    """A canonical NCHW batch in the model's data format."""
    return np.transpose(x, (0, 2, 3, 1)) if data_format == "channels_last" else x


# ------------------------------------------------------------------ canonical weights

# The weights of a layer by canonical leaf name: (the layer's attribute, canonical kind).
LEAVES = {
    layers.Conv2D: {"weight": ("kernel", "conv"), "bias": ("bias", "bias")},
    Dense: {"weight": ("kernel", "dense"), "bias": ("bias", "bias")},
    BatchNorm: {
        "weight": ("gamma", "bn_gamma"),
        "bias": ("beta", "bn_beta"),
        "running_mean": ("moving_mean", "bn_mean"),
        "running_var": ("moving_variance", "bn_var"),
    },
}
TO_KERAS = {"conv": (2, 3, 1, 0), "dense": (1, 0)}  # canonical -> Keras axes
TO_CANONICAL = {"conv": (3, 2, 0, 1), "dense": (1, 0)}  # Keras -> canonical axes


def variables(model: keras.Model) -> dict:
    """{canonical name: (Keras variable, kind)} of every weight of the model (a conv without bias has none)."""
    out = {}
    for layer in model.layers:
        for leaf, (attribute, kind) in LEAVES.get(type(layer), {}).items():
            if (variable := getattr(layer, attribute)) is not None:
                out[f"{layer.name.replace('-', '.')}.{leaf}"] = (variable, kind)
    return out


def canonical_layout(kind: str, value: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(
        np.transpose(value, TO_CANONICAL[kind]) if kind in TO_CANONICAL else value
    )


def load_canonical(model: keras.Model, weights: dict[str, np.ndarray]) -> None:
    """Assign canonical `weights` to the model's variables, in Keras layouts and the variables' dtype."""
    found = variables(model)
    if set(found) != set(weights):
        raise KeyError(
            f"weights do not match the model: missing {sorted(set(found) - set(weights))[:3]}, "
            f"unexpected {sorted(set(weights) - set(found))[:3]}"
        )
    for name, (variable, kind) in found.items():
        value = np.asarray(weights[name])
        if kind in TO_KERAS:
            value = np.transpose(value, TO_KERAS[kind])
        variable.assign(np.ascontiguousarray(value, dtype=variable.dtype))


def to_canonical(model: keras.Model, values: dict | None = None) -> dict[str, np.ndarray]:
    """The model's weights as canonical numpy arrays, in the variables' dtype; `values` ({id(variable): array})
    replaces what a variable holds (a stateless step's state, which lives outside the variables)."""
    values = values or {}
    return {
        name: canonical_layout(kind, keras.ops.convert_to_numpy(values.get(id(v), v.value)))
        for name, (v, kind) in variables(model).items()
    }


def canonical_gradients(model: keras.Model, grads: dict) -> dict[str, np.ndarray]:
    """The gradients of the trainable variables ({id(variable): tensor}) by canonical name, in canonical layouts."""
    return {
        name: canonical_layout(kind, keras.ops.convert_to_numpy(grads[id(v)]))
        for name, (v, kind) in variables(model).items()
        if v.trainable
    }
