"""ResNet-18 (d2l's variant for 28x28 inputs), d2l's from-scratch LeNet and ResNet-50 (torchvision's v1.5),
in flax (linen).

Module names follow the canonical parameter names (common/weights.py): the flax tree
{"params": {"stage2": {"0": {"conv3": {"kernel": ...}}}}} is canonical `stage2.0.conv3.weight`, and
ResNet-50's {"layer1": {"0": {"downsample": {"0": {"kernel": ...}}}}} is `layer1.0.downsample.0.weight`.
Layouts differ from the canonical ones and are converted here:
  conv kernel   flax HWIO (kh, kw, in, out)  <->  canonical OIHW (out, in, kh, kw)
  dense kernel  flax (in, out)               <->  canonical (out, in)
  BatchNorm     scale, bias, mean, var       <->  weight, bias, running_mean, running_var
Activations are NHWC inside the network; callers pass canonical NCHW batches to `forward`.
`dtype` (None: float32, or whatever the input is) is the compute dtype of every Conv, Dense and
BatchNorm, e.g. jnp.bfloat16 for --precision bf16; parameters and BatchNorm statistics are
`param_dtype` (float32; float64 for the float64 equivalence runs), and `forward` hands back logits
of at least float32, so the loss is computed in float32 (or float64).
BatchNorm is the backend's own (batchnorm.py): flax's updates the running variance with the biased
batch variance, torch with the unbiased one, and every backend follows torch.
At the end, the math of a step every strategy shares on one device's shard: the loss, the SGD update and
the predicted classes of evaluation (strategies.py decides how they are spread over the devices).
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from backends.jax.batchnorm import BatchNorm
from backends.jax.environment import DTYPES, computing_in, module_dtypes
from common import architectures
from common.architectures import RESNET50_LAYERS

# A layer made by a functools.partial of a flax class with the network's dtypes bound, as flax's ImageNet example
# passes its `conv` and `norm` to its blocks.
ModuleDef = Any


def layers(dtype: Any, param_dtype: Any, bn_axis: str | None, train: bool):
    """(conv, norm, dense) of one network. Convolutions pad as torch's do, explicitly and symmetrically, 0 unless
    given (flax's "SAME" pads stride-2 convs differently). `bn_axis`: None normalises with this device's batch; a
    pmap / shard_map axis name pmean's the batch statistics over it (synchronised BatchNorm: the global batch's)."""
    dtypes = dict(dtype=dtype, param_dtype=param_dtype)
    conv = functools.partial(nn.Conv, padding=0, **dtypes)
    norm = functools.partial(BatchNorm, use_running_average=not train, axis_name=bn_axis, **dtypes)
    return conv, norm, functools.partial(nn.Dense, **dtypes)


class Residual(nn.Module):
    """d2l's residual block: two 3x3 convs with BatchNorm; a 1x1 conv on the shortcut when shape changes."""

    channels: int
    conv: ModuleDef
    norm: ModuleDef
    use_1x1conv: bool = False
    stride: int = 1

    @nn.compact
    def __call__(self, x):
        conv, norm = self.conv, self.norm
        y = nn.relu(
            norm(name="bn1")(conv(self.channels, (3, 3), self.stride, padding=1, name="conv1")(x))
        )
        y = norm(name="bn2")(conv(self.channels, (3, 3), padding=1, name="conv2")(y))
        shortcut = (
            conv(self.channels, (1, 1), self.stride, name="conv3")(x) if self.use_1x1conv else x
        )
        return nn.relu(y + shortcut)


class Stage(nn.Module):
    """Two residual blocks named "0" and "1" (torch's nn.Sequential indices); the first may downsample."""

    channels: int
    first: bool
    conv: ModuleDef
    norm: ModuleDef

    @nn.compact
    def __call__(self, x):
        same = dict(conv=self.conv, norm=self.norm)
        if self.first:
            x = Residual(self.channels, **same, name="0")(x)
        else:
            x = Residual(self.channels, **same, use_1x1conv=True, stride=2, name="0")(x)
        return Residual(self.channels, **same, name="1")(x)


class ResNet18(nn.Module):
    """3x3 stride-1 stem (no max-pool), stages of 64/128/256/512 channels, global average pool, dense.

    `bn_axis`: the device axis BatchNorm synchronises its statistics over (None: per device)."""

    # its name in common/architectures.py (see native_shapes)
    architecture: ClassVar[str] = "resnet18"
    num_classes: int = 10
    bn_axis: str | None = None
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool = False):
        conv, norm, dense = layers(self.dtype, self.param_dtype, self.bn_axis, train)
        x = nn.relu(norm(name="bn")(conv(64, (3, 3), padding=1, name="conv")(x)))
        for i, channels in enumerate((64, 128, 256, 512)):
            x = Stage(channels, i == 0, conv, norm, name=f"stage{i + 1}")(x)
        return dense(self.num_classes, name="fc")(jnp.mean(x, axis=(1, 2)))


class LeNet(nn.Module):
    """The from-scratch chapter's network: conv3x3(20) relu avgpool, conv5x5(50) relu avgpool, 800-128-10."""

    architecture: ClassVar[str] = "lenet"
    num_classes: int = 10
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool = False):
        conv, _, dense = layers(self.dtype, self.param_dtype, None, train)
        x = nn.avg_pool(nn.relu(conv(20, (3, 3), name="conv1")(x)), (2, 2), strides=(2, 2))
        x = nn.avg_pool(nn.relu(conv(50, (5, 5), name="conv2")(x)), (2, 2), strides=(2, 2))
        # flatten in torch's (C, H, W) order
        x = jnp.transpose(x, (0, 3, 1, 2)).reshape(x.shape[0], -1)
        x = nn.relu(dense(128, name="fc1")(x))
        return dense(self.num_classes, name="fc2")(x)


class Downsample(nn.Module):
    """torchvision's `downsample` nn.Sequential: a strided 1x1 conv "0" and a BatchNorm "1"."""

    features: int
    stride: int
    conv: ModuleDef
    norm: ModuleDef

    @nn.compact
    def __call__(self, x):
        return self.norm(name="1")(self.conv(self.features, (1, 1), self.stride, name="0")(x))


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (v1.5: the stride on the 3x3 conv): 1x1, 3x3, 1x1 (4x the planes), bias-free
    convs each followed by BatchNorm; a strided 1x1 conv + BatchNorm (`downsample`) on a changed shortcut."""

    planes: int
    conv: ModuleDef
    norm: ModuleDef
    stride: int = 1
    downsample: bool = False

    @nn.compact
    def __call__(self, x):
        conv, norm = self.conv, self.norm
        y = nn.relu(norm(name="bn1")(conv(self.planes, (1, 1), name="conv1")(x)))
        y = nn.relu(
            norm(name="bn2")(conv(self.planes, (3, 3), self.stride, padding=1, name="conv2")(y))
        )
        y = norm(name="bn3")(conv(4 * self.planes, (1, 1), name="conv3")(y))
        if self.downsample:
            x = Downsample(4 * self.planes, self.stride, conv, norm, name="downsample")(x)
        return nn.relu(y + x)


class Layer(nn.Module):
    """torchvision's layer1..layer4: `blocks` bottlenecks named "0", "1", ... (nn.Sequential's indices); the
    first takes the stride and the downsampling shortcut."""

    planes: int
    blocks: int
    stride: int
    conv: ModuleDef
    norm: ModuleDef

    @nn.compact
    def __call__(self, x):
        same = dict(conv=self.conv, norm=self.norm)
        x = Bottleneck(self.planes, **same, stride=self.stride, downsample=True, name="0")(x)
        for i in range(1, self.blocks):
            x = Bottleneck(self.planes, **same, name=str(i))(x)
        return x


class ResNet50(nn.Module):
    """torchvision's resnet50, module for module: 7x7 stride-2 stem, 3x3 stride-2 max-pool, layer1..layer4
    of 3/4/6/3 bottlenecks, global average pool, dense.

    `bn_axis`: the device axis BatchNorm synchronises its statistics over (None: per device)."""

    architecture: ClassVar[str] = "resnet50"
    num_classes: int = 1000
    bn_axis: str | None = None
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool = False):
        conv, norm, dense = layers(self.dtype, self.param_dtype, self.bn_axis, train)
        conv = functools.partial(conv, use_bias=False)  # torchvision's convolutions have no bias
        x = nn.relu(norm(name="bn1")(conv(64, (7, 7), 2, padding=3, name="conv1")(x)))
        # padded with -inf, as torch's (after the ReLU, zero padding would give the same maxima)
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        for i, (planes, blocks, stride) in enumerate(RESNET50_LAYERS, start=1):
            x = Layer(planes, blocks, stride, conv, norm, name=f"layer{i}")(x)
        return dense(self.num_classes, name="fc")(jnp.mean(x, axis=(1, 2)))


def resnet18(
    num_classes: int = 10,
    in_channels: int = 1,
    bn_axis: str | None = None,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
) -> ResNet18:
    """`in_channels` is read from the input by flax; kept for the common signature."""
    return ResNet18(num_classes, bn_axis=bn_axis, dtype=dtype, param_dtype=param_dtype)


def lenet(
    num_classes: int = 10,
    in_channels: int = 1,
    bn_axis: str | None = None,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
) -> LeNet:
    """LeNet has no BatchNorm: `bn_axis` is accepted and has nothing to do."""
    return LeNet(num_classes, dtype=dtype, param_dtype=param_dtype)


def resnet50(
    num_classes: int = 1000,
    in_channels: int = 3,
    bn_axis: str | None = None,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
) -> ResNet50:
    """`in_channels` is read from the input by flax; kept for the common signature."""
    return ResNet50(num_classes, bn_axis=bn_axis, dtype=dtype, param_dtype=param_dtype)


MODELS = {"resnet18": resnet18, "lenet": lenet, "resnet50": resnet50}


def build(
    model: str, bn_axis: str | None = None, dtype: Any = None, param_dtype: Any = jnp.float32
) -> nn.Module:
    """The network with the classes of the input it takes (common/architectures.py). `dtype`: the compute
    dtype (None: that of the input, float32 in training); `param_dtype`: that of the parameters and BatchNorm
    statistics (float32; float64 with jax_enable_x64 for float64 runs)."""
    return MODELS[model](
        architectures.num_classes(model),
        architectures.in_channels(model),
        bn_axis=bn_axis,
        dtype=dtype,
        param_dtype=param_dtype,
    )


def _at_least_float32(logits):
    """bfloat16 logits as float32 (the loss and argmax in float32); float32 and float64 as they are."""
    return logits.astype(jnp.promote_types(logits.dtype, jnp.float32))


def forward(net: nn.Module, variables: dict, x, train: bool):
    """Logits (at least float32) for an NCHW batch; in training also the updated BatchNorm statistics."""
    x = jnp.transpose(x, (0, 2, 3, 1))
    if not train:
        return _at_least_float32(net.apply(variables, x, train=False))
    logits, updates = net.apply(variables, x, train=True, mutable=["batch_stats"])
    return _at_least_float32(logits), updates.get("batch_stats", {})


def native_shapes(net: nn.Module) -> dict:
    """{"params": ..., "batch_stats": ...} of shape structs, without computing anything: flax reads the
    input channels from a sample, one small image of the network's input (NHWC)."""
    n, c, h, w = architectures.example_shape(net.architecture)
    x = jax.ShapeDtypeStruct((n, h, w, c), jnp.float32)
    shapes = jax.eval_shape(lambda x: net.init(jax.random.key(0), x, train=False), x)
    return {"params": dict(shapes["params"]), "batch_stats": dict(shapes.get("batch_stats", {}))}


def count_params(net: nn.Module) -> int:
    """Trainable parameters (BatchNorm running statistics are batch_stats, not params)."""
    return sum(int(np.prod(s.shape)) for s in jax.tree.leaves(native_shapes(net)["params"]))


# ------------------------------------------------------------------ canonical weights


def _leaves(tree: dict, prefix: str = ""):
    """(module path "stage2.0.conv3", leaf name "kernel", the leaf's parent dict) for every leaf."""
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield prefix[:-1], key, tree


def _canonical_entry(collection: str, leaf: str, value, siblings: dict):
    """(canonical leaf name, kind, value in canonical layout) of one native leaf."""
    if collection == "batch_stats":
        return {"mean": ("running_mean", "bn_mean"), "var": ("running_var", "bn_var")}[leaf] + (
            value,
        )
    if "scale" in siblings:  # a BatchNorm's parameters
        return {"scale": ("weight", "bn_gamma"), "bias": ("bias", "bn_beta")}[leaf] + (value,)
    if leaf == "bias":
        return "bias", "bias", value
    if len(value.shape) == 4:
        return "weight", "conv", _transpose(value, (3, 2, 0, 1))  # HWIO -> OIHW
    return "weight", "dense", _transpose(value, (1, 0))  # (in, out) -> (out, in)


def _transpose(value, axes):
    if isinstance(value, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(tuple(value.shape[a] for a in axes), value.dtype)
    return np.transpose(value, axes)


def _to_canonical(native: dict):
    """{canonical name: (kind, value)} for a native tree of arrays or shape structs."""
    out = {}
    for collection in ("params", "batch_stats"):
        for module, leaf, siblings in _leaves(dict(native.get(collection, {}))):
            name, kind, value = _canonical_entry(collection, leaf, siblings[leaf], siblings)
            out[f"{module}.{name}"] = (kind, value)
    return out


def spec(net: nn.Module) -> list[tuple[str, tuple[int, ...], str]]:
    """(canonical name, shape, kind) for every weight common/weights.py initialises."""
    return [
        (name, tuple(value.shape), kind)
        for name, (kind, value) in _to_canonical(native_shapes(net)).items()
    ]


def to_canonical(native: dict, dtype=np.float32) -> dict[str, np.ndarray]:
    """Canonical numpy weights from a {"params", "batch_stats"} tree (host or device arrays)."""
    native = jax.tree.map(lambda a: np.asarray(a, dtype=dtype), native)
    return {name: np.ascontiguousarray(value) for name, (_, value) in _to_canonical(native).items()}


def from_canonical(net: nn.Module, weights: dict[str, np.ndarray]) -> dict:
    """The {"params", "batch_stats"} tree (numpy) holding canonical `weights`, in flax layouts and the
    net's parameter dtype (float32 weights cast to float64 exactly for a float64 net)."""
    expected = {name for name, _, _ in spec(net)}
    if expected != set(weights):
        raise KeyError(
            f"weights do not match the model: missing {sorted(expected - set(weights))[:3]}, "
            f"unexpected {sorted(set(weights) - expected)[:3]}"
        )
    native = {"params": {}, "batch_stats": {}}
    for collection, shapes in native_shapes(net).items():
        for module, leaf, siblings in _leaves(shapes):
            name, kind, _ = _canonical_entry(collection, leaf, siblings[leaf], siblings)
            node = native[collection]
            for key in module.split("."):
                node = node.setdefault(key, {})
            node[leaf] = _native_layout(kind, weights[f"{module}.{name}"], siblings[leaf].dtype)
    return native


def predict(
    model: str, weights: dict[str, np.ndarray], x: np.ndarray, train: bool, dtype: str
) -> np.ndarray:
    """Logits of `model` with canonical `weights` on a numpy NCHW batch, on one CPU device, in `dtype`
    (common/backend.py); in training mode the running statistics it would update are dropped."""
    # On the CPU at full float32 precision whatever the host has: on a GPU XLA's default would be TF32
    # matmuls, and the equivalence check compares these logits with the other backends' CPU logits.
    with (
        computing_in(dtype),
        jax.default_device(jax.devices("cpu")[0]),
        jax.default_matmul_precision("highest"),
    ):
        net = build(model, **module_dtypes("fp32", dtype))
        out = forward(
            net, from_canonical(net, weights), np.asarray(x, dtype=DTYPES[dtype]), train=train
        )
        return np.asarray(out[0] if train else out)


def _native_layout(kind: str, value, dtype) -> np.ndarray:
    value = np.asarray(value, dtype=dtype)
    if kind == "conv":
        value = np.transpose(value, (2, 3, 1, 0))  # OIHW -> HWIO
    elif kind == "dense":
        value = value.T  # (out, in) -> (in, out)
    return np.ascontiguousarray(value)


# ------------------------------------------------------------------- the math every strategy shares


def local_loss(net, params, stats, x, y):
    """Sum of the cross-entropy over this device's examples; (new BatchNorm stats, loss sum, correct) as aux."""
    logits, new_stats = forward(net, {"params": params, "batch_stats": stats}, x, train=True)
    loss_sum = optax.softmax_cross_entropy_with_integer_labels(logits, y).sum()
    correct = jnp.sum(jnp.argmax(logits, axis=-1) == y)
    return loss_sum, (new_stats, loss_sum, correct)


def sgd(tx, params, opt_state, grads):
    """The SGD update of every strategy, the same in step() and update(): (new params, new opt_state)."""
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def predict_classes(net):
    """A compiled (params, batch_stats, x) -> predicted classes, in eval mode."""

    @jax.jit
    def predict(params, stats, x):
        logits = forward(net, {"params": params, "batch_stats": stats}, x, train=False)
        return jnp.argmax(logits, axis=-1)

    return predict
