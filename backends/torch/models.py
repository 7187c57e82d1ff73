"""ResNet-18 (d2l's variant for 28x28 inputs), d2l's from-scratch LeNet and ResNet-50 (torchvision's v1.5), in PyTorch.

Module names are the canonical parameter names (common/weights.py), and PyTorch's
layouts are the canonical layouts, so the mapping canonical <-> native is the identity.
Below them, what the strategies do to a model: its levers (channels-last, torch.compile, bf16 autocast
for nn.DataParallel), its optimizer, its BatchNorm statistics, its test accuracy.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from backends.torch.parallel import as_tensor, load_whole, whole
from common import architectures
from common.architectures import RESNET50_LAYERS

BN_EPS = 1e-5
BN_MOMENTUM = 0.1  # PyTorch convention: new = (1 - m) * old + m * batch (0.9 in MXNet/flax terms)


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=BN_EPS, momentum=BN_MOMENTUM)


class Residual(nn.Module):
    """d2l's residual block: two 3x3 convs with BatchNorm; a 1x1 conv on the shortcut when shape changes."""

    def __init__(
        self, in_channels: int, out_channels: int, use_1x1conv: bool = False, stride: int = 1
    ):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1)
        self.bn1 = _bn(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.bn2 = _bn(out_channels)
        self.conv3 = nn.Conv2d(in_channels, out_channels, 1, stride=stride) if use_1x1conv else None

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        shortcut = self.conv3(x) if self.conv3 is not None else x
        return F.relu(y + shortcut)


def _stage(in_channels: int, out_channels: int, first: bool) -> nn.Sequential:
    if first:
        return nn.Sequential(
            Residual(in_channels, out_channels), Residual(out_channels, out_channels)
        )
    return nn.Sequential(
        Residual(in_channels, out_channels, use_1x1conv=True, stride=2),
        Residual(out_channels, out_channels),
    )


class ResNet18(nn.Module):
    """3x3 stride-1 stem (no max-pool), stages of 64/128/256/512 channels, global average pool, linear."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1)
        self.bn = _bn(64)
        self.stage1 = _stage(64, 64, first=True)
        self.stage2 = _stage(64, 128, first=False)
        self.stage3 = _stage(128, 256, first=False)
        self.stage4 = _stage(256, 512, first=False)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        x = self.stage4(self.stage3(self.stage2(self.stage1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class LeNet(nn.Module):
    """The from-scratch chapter's network: conv3x3(20) relu avgpool, conv5x5(50) relu avgpool, 800-128-10."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 20, 3)
        self.conv2 = nn.Conv2d(20, 50, 5)
        self.fc1 = nn.Linear(800, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):
        x = F.avg_pool2d(F.relu(self.conv1(x)), 2, 2)
        x = F.avg_pool2d(F.relu(self.conv2(x)), 2, 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (v1.5: the stride on the 3x3 conv): 1x1, 3x3, 1x1 (4x the planes), bias-free
    convs each followed by BatchNorm; a strided 1x1 conv + BatchNorm (`downsample`) on a changed shortcut."""

    def __init__(self, in_channels: int, planes: int, stride: int = 1, downsample: bool = False):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, planes, 1, bias=False)
        self.bn1 = _bn(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = _bn(planes)
        self.conv3 = nn.Conv2d(planes, 4 * planes, 1, bias=False)
        self.bn3 = _bn(4 * planes)
        self.downsample = (
            nn.Sequential(
                nn.Conv2d(in_channels, 4 * planes, 1, stride=stride, bias=False), _bn(4 * planes)
            )
            if downsample
            else None
        )

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


class ResNet50(nn.Module):
    """torchvision's resnet50, module for module (its parameter names are the canonical ones): 7x7 stride-2
    stem, 3x3 stride-2 max-pool, layer1..layer4 of 3/4/6/3 bottlenecks, global average pool, linear."""

    def __init__(self, num_classes: int = 1000, in_channels: int = 3):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = _bn(64)
        channels = 64
        for index, (planes, blocks, stride) in enumerate(RESNET50_LAYERS, start=1):
            layer = [Bottleneck(channels, planes, stride, downsample=True)]
            layer += [Bottleneck(4 * planes, planes) for _ in range(blocks - 1)]
            setattr(self, f"layer{index}", nn.Sequential(*layer))
            channels = 4 * planes
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, stride=2, padding=1)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet18(num_classes: int = 10, in_channels: int = 1) -> ResNet18:
    return ResNet18(num_classes, in_channels)


def lenet(num_classes: int = 10, in_channels: int = 1) -> LeNet:
    return LeNet(num_classes, in_channels)


def resnet50(num_classes: int = 1000, in_channels: int = 3) -> ResNet50:
    return ResNet50(num_classes, in_channels)


MODELS = {"resnet18": resnet18, "lenet": lenet, "resnet50": resnet50}


def build(model: str) -> nn.Module:
    """The network with the channels and classes of the input it takes (common/architectures.py)."""
    return MODELS[model](architectures.num_classes(model), architectures.in_channels(model))


def count_params(net: nn.Module) -> int:
    """Trainable parameters (BatchNorm running statistics are buffers, not parameters)."""
    return sum(p.numel() for p in net.parameters())


# ------------------------------------------------------------------ canonical weights


def spec(net: nn.Module) -> list[tuple[str, tuple[int, ...], str]]:
    """(canonical name, shape, kind) for every weight common/weights.py initialises."""
    out = []
    for prefix, module in net.named_modules():
        p = prefix + "." if prefix else ""
        if isinstance(module, nn.Conv2d):
            out += [(p + "weight", tuple(module.weight.shape), "conv")]
            out += (
                [(p + "bias", tuple(module.bias.shape), "bias")] if module.bias is not None else []
            )
        elif isinstance(module, nn.Linear):
            out += [
                (p + "weight", tuple(module.weight.shape), "dense"),
                (p + "bias", tuple(module.bias.shape), "bias"),
            ]
        elif isinstance(module, nn.BatchNorm2d):
            c = (module.num_features,)
            out += [
                (p + "weight", c, "bn_gamma"),
                (p + "bias", c, "bn_beta"),
                (p + "running_mean", c, "bn_mean"),
                (p + "running_var", c, "bn_var"),
            ]
    return out


def _canonical_entries(net: nn.Module) -> dict[str, torch.Tensor]:
    return {
        k: v
        for k, v in net.state_dict(keep_vars=True).items()
        if not k.endswith("num_batches_tracked")
    }


def load_canonical(net: nn.Module, weights: dict[str, np.ndarray]) -> None:
    """Copy canonical numpy weights into the module, in place (keeps its device and dtype: copy_ casts,
    so float32 weights load exactly into a float64 model); a sharded parameter (fsdp) takes its rank's shard."""
    entries = _canonical_entries(net)
    if set(entries) != set(weights):
        raise KeyError(
            f"weights do not match the model: missing {sorted(set(entries) - set(weights))[:3]}, "
            f"unexpected {sorted(set(weights) - set(entries))[:3]}"
        )
    with torch.no_grad():
        for name, tensor in entries.items():
            load_whole(tensor, torch.from_numpy(np.asarray(weights[name])))


def to_canonical(net: nn.Module) -> dict[str, np.ndarray]:
    """The module's canonical weights as numpy arrays; sharded parameters (fsdp) gathered whole, a collective
    every rank calls."""
    return {k: whole(v.detach()).cpu().numpy().copy() for k, v in _canonical_entries(net).items()}


# ------------------------------------------------------------------ as the strategies run a model


def predict(
    model: str, weights: dict[str, np.ndarray], x: np.ndarray, train: bool, dtype: str
) -> np.ndarray:
    """Logits of `model` with canonical `weights` on a numpy batch, on the CPU in `dtype` (common/backend.py)."""
    precision = getattr(torch, dtype)
    net = build(model).to(precision)
    load_canonical(net, weights)
    net.train(train)
    with torch.no_grad():
        return net(torch.from_numpy(np.asarray(x)).to(precision)).numpy()


def prepare(net: nn.Module, cfg) -> nn.Module:
    """--channels-last: the 4-d weights in NHWC (values and canonical names unchanged)."""
    return net.to(memory_format=torch.channels_last) if cfg.levers.channels_last else net


def layout(cfg) -> str:
    """The layout the model computes in: NHWC with --channels-last, else NCHW (laid_out() makes the batches so)."""
    return "NHWC" if cfg.levers.channels_last else "NCHW"


def laid_out(x: torch.Tensor, cfg) -> torch.Tensor:
    """A 4-d batch in the run's layout, by its strides too. cuDNN computes in NHWC when the input's strides say
    so, and a one-channel batch is contiguous in both layouts: Fashion-MNIST's arrive with NHWC's strides
    (784, 1, 28, 1), which made a run without --channels-last compute in NHWC. Restriding a batch already
    contiguous in the layout changes only the strides of its size-1 axes: no copy."""
    if x.dim() != 4:
        return x
    memory_format = torch.channels_last if cfg.levers.channels_last else torch.contiguous_format
    if not x.is_contiguous(memory_format=memory_format):
        return x.contiguous(memory_format=memory_format)
    return x.as_strided(x.shape, canonical_strides(tuple(x.shape), layout(cfg)))


def canonical_strides(shape: tuple[int, int, int, int], name: str) -> tuple[int, int, int, int]:
    """The strides of a dense (N, C, H, W) tensor stored in `name` order (NCHW or NHWC), in elements."""
    _, c, h, w = shape
    if name == "NHWC":
        return (h * w * c, 1, w * c, c)
    return (c * h * w, h * w, w, 1)


def computed_layout(x: torch.Tensor) -> str:
    """The layout torch computes a 4-d input in, read from its strides as torch itself reads them."""
    from torch._prims_common import suggest_memory_format  # torch's own rule; no public twin

    return "NHWC" if suggest_memory_format(x) == torch.channels_last else "NCHW"


def compiled_graphs(cfg) -> int:
    """The graphs torch.compile has compiled in this process (dynamo's own count); 0 without --compile, where
    nothing is compiled."""
    if not cfg.levers.compile:
        return 0
    from torch._dynamo.utils import counters  # dynamo's statistics: no public counter exists

    return counters["stats"]["unique_graphs"]


def compile_options(cfg) -> dict:
    """torch.compile's arguments for --compile-mode (none for the default mode)."""
    return {} if cfg.levers.compile_mode == "default" else {"mode": cfg.levers.compile_mode}


def sgd(params, cfg) -> torch.optim.SGD:
    """torch.optim.SGD (dp, ddp), its update one multi-tensor (foreach) kernel per step on CUDA."""
    return torch.optim.SGD(params, lr=cfg.lr, foreach=cfg.device_kind == "gpu")


class AutocastForward(nn.Module):
    """dp with bf16: autocast opened inside each replica's forward. DataParallel runs replicas in their
    own threads, where autocast is re-entered with the thread's default dtype (float16 on CUDA)."""

    def __init__(self, inner: nn.Module, device_type: str):
        super().__init__()
        self.inner, self.device_type = inner, device_type

    def forward(self, x):
        with torch.autocast(device_type=self.device_type, dtype=torch.bfloat16):
            return self.inner(x)


def step_metrics(logits: torch.Tensor, y: torch.Tensor, loss_sum: torch.Tensor):
    """(loss sum, correct) as detached device tensors: read back later, after the timer."""
    return loss_sum.detach(), (logits.argmax(dim=1) == y).sum()


def bn_buffers(net: nn.Module) -> list[torch.Tensor]:
    """The BatchNorm running means, then the running variances."""
    return [
        m.running_mean for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
    ] + [m.running_var for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def accuracy_counts(net: nn.Module, batches, device) -> tuple[int, int]:
    """(correct, total) of the module in evaluation mode on numpy test batches."""
    correct = total = 0
    net.eval()
    with torch.no_grad():
        for x, y in batches:
            logits = net(as_tensor(x).to(device))
            correct += int((logits.argmax(dim=1).cpu() == as_tensor(y).long()).sum())
            total += len(y)
    net.train()
    return correct, total
