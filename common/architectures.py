"""The networks as canonical parameter lists: (name, shape, kind), framework-free, and the input each takes.

These names and layouts are the lingua franca between backends: conv kernels
(out, in, kh, kw), dense (out, in), BatchNorm weight / bias / running_mean /
running_var. Each backend maps its native parameters onto exactly this list (a
contract test checks it), so one file of weights fits every framework.
"""

from __future__ import annotations

Spec = list[tuple[str, tuple[int, ...], str]]


def _conv(name: str, out_ch: int, in_ch: int, k: int, bias: bool = True) -> Spec:
    weight = [(f"{name}.weight", (out_ch, in_ch, k, k), "conv")]
    return weight + ([(f"{name}.bias", (out_ch,), "bias")] if bias else [])


def _dense(name: str, out_f: int, in_f: int) -> Spec:
    return [(f"{name}.weight", (out_f, in_f), "dense"), (f"{name}.bias", (out_f,), "bias")]


def _bn(name: str, ch: int) -> Spec:
    return [
        (f"{name}.weight", (ch,), "bn_gamma"),
        (f"{name}.bias", (ch,), "bn_beta"),
        (f"{name}.running_mean", (ch,), "bn_mean"),
        (f"{name}.running_var", (ch,), "bn_var"),
    ]


def _residual(name: str, in_ch: int, out_ch: int, shortcut: bool) -> Spec:
    spec = _conv(f"{name}.conv1", out_ch, in_ch, 3) + _bn(f"{name}.bn1", out_ch)
    spec += _conv(f"{name}.conv2", out_ch, out_ch, 3) + _bn(f"{name}.bn2", out_ch)
    return spec + (_conv(f"{name}.conv3", out_ch, in_ch, 1) if shortcut else [])


def resnet18_spec(num_classes: int = 10, in_channels: int = 1) -> Spec:
    """d2l's ResNet-18 variant: 3x3 stem, four stages of two residual blocks, linear head."""
    spec = _conv("conv", 64, in_channels, 3) + _bn("bn", 64)
    in_ch = 64
    for stage, out_ch in enumerate((64, 128, 256, 512), start=1):
        spec += _residual(f"stage{stage}.0", in_ch, out_ch, shortcut=stage > 1)
        spec += _residual(f"stage{stage}.1", out_ch, out_ch, shortcut=False)
        in_ch = out_ch
    return spec + _dense("fc", num_classes, 512)


def lenet_spec(num_classes: int = 10, in_channels: int = 1) -> Spec:
    """d2l's from-scratch LeNet: two convolutions, two dense layers."""
    return (
        _conv("conv1", 20, in_channels, 3)
        + _conv("conv2", 50, 20, 5)
        + _dense("fc1", 128, 800)
        + _dense("fc2", num_classes, 128)
    )


def _bottleneck(name: str, in_ch: int, planes: int, downsample: bool) -> Spec:
    """torchvision's Bottleneck (ResNet v1.5): 1x1 (planes), 3x3 (planes, the block's stride), 1x1 (4 x planes),
    each without bias and followed by BatchNorm; a strided 1x1 conv + BatchNorm (`downsample`) on the shortcut
    when the shape changes."""
    spec = _conv(f"{name}.conv1", planes, in_ch, 1, bias=False) + _bn(f"{name}.bn1", planes)
    spec += _conv(f"{name}.conv2", planes, planes, 3, bias=False) + _bn(f"{name}.bn2", planes)
    spec += _conv(f"{name}.conv3", 4 * planes, planes, 1, bias=False) + _bn(
        f"{name}.bn3", 4 * planes
    )
    if downsample:
        spec += _conv(f"{name}.downsample.0", 4 * planes, in_ch, 1, bias=False)
        spec += _bn(f"{name}.downsample.1", 4 * planes)
    return spec


RESNET50_LAYERS = (
    (64, 3, 1),
    (128, 4, 2),
    (256, 6, 2),
    (512, 3, 2),
)  # (planes, blocks, stride of the first)


def resnet50_spec(num_classes: int = 1000, in_channels: int = 3) -> Spec:
    """torchvision's resnet50 under torchvision's own names: 7x7 stride-2 stem (no bias), BatchNorm, ReLU,
    3x3 stride-2 max-pool, layer1..layer4 of 3/4/6/3 bottlenecks, global average pool, linear head."""
    spec = _conv("conv1", 64, in_channels, 7, bias=False) + _bn("bn1", 64)
    in_ch = 64
    for layer, (planes, blocks, _) in enumerate(RESNET50_LAYERS, start=1):
        for block in range(blocks):
            spec += _bottleneck(f"layer{layer}.{block}", in_ch, planes, downsample=block == 0)
            in_ch = 4 * planes
    return spec + _dense("fc", num_classes, 2048)


SPECS = {"resnet18": resnet18_spec, "lenet": lenet_spec, "resnet50": resnet50_spec}

# The input each network takes: (channels, classes, the image side of its dataset by default, the smallest
# side it accepts). LeNet's dense layer fixes 28x28; the ResNets pool globally, so any side from the smallest
# works (ResNet-50 halves it five times).
INPUTS = {"resnet18": (1, 10, 28, 28), "lenet": (1, 10, 28, 28), "resnet50": (3, 1000, 224, 32)}


def in_channels(model: str) -> int:
    return INPUTS[model][0]


def num_classes(model: str) -> int:
    return INPUTS[model][1]


def default_image_size(model: str) -> int:
    return INPUTS[model][2]


def smallest_image_size(model: str) -> int:
    return INPUTS[model][3]


def example_shape(model: str) -> tuple[int, int, int, int]:
    """NCHW of one small image the network accepts (for building a model's parameters from a sample)."""
    side = smallest_image_size(model)
    return (1, in_channels(model), side, side)


def spec(model: str) -> Spec:
    return SPECS[model](num_classes(model), in_channels(model))


STATE_KINDS = ("bn_mean", "bn_var")  # BatchNorm running statistics: state, not parameters


def trainable_names(model: str) -> list[str]:
    """The canonical names of `model`'s parameters, its BatchNorm running statistics left out."""
    return [name for name, _, kind in spec(model) if kind not in STATE_KINDS]


def trainable_count(model: str) -> int:
    """Parameters (BatchNorm running statistics are state, not parameters)."""
    count = 0
    for _, shape, kind in spec(model):
        if kind not in STATE_KINDS:
            n = 1
            for d in shape:
                n *= d
            count += n
    return count
