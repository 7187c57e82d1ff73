"""The two networks as canonical parameter lists: (name, shape, kind), framework-free.

These names and layouts are the lingua franca between backends: conv kernels
(out, in, kh, kw), dense (out, in), BatchNorm weight / bias / running_mean /
running_var. Each backend maps its native parameters onto exactly this list (a
contract test checks it), so one file of weights fits every framework.
"""

from __future__ import annotations

Spec = list[tuple[str, tuple[int, ...], str]]


def _conv(name: str, out_ch: int, in_ch: int, k: int) -> Spec:
    return [(f"{name}.weight", (out_ch, in_ch, k, k), "conv"), (f"{name}.bias", (out_ch,), "bias")]


def _dense(name: str, out_f: int, in_f: int) -> Spec:
    return [(f"{name}.weight", (out_f, in_f), "dense"), (f"{name}.bias", (out_f,), "bias")]


def _bn(name: str, ch: int) -> Spec:
    return [(f"{name}.weight", (ch,), "bn_gamma"), (f"{name}.bias", (ch,), "bn_beta"),
            (f"{name}.running_mean", (ch,), "bn_mean"), (f"{name}.running_var", (ch,), "bn_var")]


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
    return _conv("conv1", 20, in_channels, 3) + _conv("conv2", 50, 20, 5) + \
        _dense("fc1", 128, 800) + _dense("fc2", num_classes, 128)


SPECS = {"resnet18": resnet18_spec, "lenet": lenet_spec}


def spec(model: str) -> Spec:
    return SPECS[model]()


def trainable_count(model: str) -> int:
    """Parameters (BatchNorm running statistics are state, not parameters)."""
    count = 0
    for _, shape, kind in spec(model):
        if kind not in ("bn_mean", "bn_var"):
            n = 1
            for d in shape:
                n *= d
            count += n
    return count
