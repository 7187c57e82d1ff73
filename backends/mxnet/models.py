"""ResNet-18 (d2l's variant for 28x28 inputs), d2l's from-scratch LeNet and ResNet-50 (torchvision's v1.5),
in Gluon.

Layer for layer the networks of backends/torch/models.py. Child blocks carry the
canonical names as attribute names, so `_collect_params_with_prefix()` yields
`stage2.0.conv3.weight`, `bn.gamma`, `layer1.0.downsample.0.weight`, ...; the canonical
names (common/weights.py) differ only for BatchNorm's gamma/beta, which torch calls
weight/bias. Gluon's layouts (conv OIHW, dense (out, in)) are the canonical layouts, so
values copy unchanged. ResNet-50's convs have no bias, so they have no `bias` parameter.

BatchNorm is nn.BatchNorm (each context its own shard's statistics) or, for --bn sync,
Gluon's contrib SyncBatchNorm (statistics over the shards of all contexts); both
have the same parameters, so the canonical names do not depend on the mode. Their
running statistics follow torch's convention (batchnorm.py).

Below the networks: what the strategies build and run on them (the network of a run, its trainable
and statistic parameters, one shard's forward and backward, accuracy counts).
"""

from __future__ import annotations

import numpy as np

from backends.mxnet.batchnorm import Norm, batchnorm, sync_batchnorm
from backends.mxnet.compat import mx
from backends.mxnet.environment import hybridize_flags, hybridized
from backends.mxnet.parallel import as_ndarray
from common import architectures
from common.architectures import RESNET50_LAYERS
from common.config import RunConfig

from mxnet import autograd, gluon
from mxnet.gluon import nn


def _conv(
    in_channels: int,
    out_channels: int,
    kernel: int,
    stride: int = 1,
    padding: int = 0,
    bias: bool = True,
) -> nn.Conv2D:
    return nn.Conv2D(
        out_channels,
        kernel,
        strides=stride,
        padding=padding,
        in_channels=in_channels,
        use_bias=bias,
    )


class Residual(nn.HybridBlock):
    """d2l's residual block: two 3x3 convs with BatchNorm; a 1x1 conv on the shortcut when shape changes."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        use_1x1conv: bool = False,
        stride: int = 1,
        norm: Norm = batchnorm,
    ):
        super().__init__()
        self.conv1 = _conv(in_channels, out_channels, 3, stride=stride, padding=1)
        self.bn1 = norm(out_channels)
        self.conv2 = _conv(out_channels, out_channels, 3, padding=1)
        self.bn2 = norm(out_channels)
        self.conv3 = _conv(in_channels, out_channels, 1, stride=stride) if use_1x1conv else None

    def hybrid_forward(self, F, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        shortcut = self.conv3(x) if self.conv3 is not None else x
        return F.relu(y + shortcut)


def _stage(in_channels: int, out_channels: int, first: bool, norm: Norm) -> nn.HybridSequential:
    stage = nn.HybridSequential()
    if first:
        stage.add(
            Residual(in_channels, out_channels, norm=norm),
            Residual(out_channels, out_channels, norm=norm),
        )
    else:
        stage.add(
            Residual(in_channels, out_channels, use_1x1conv=True, stride=2, norm=norm),
            Residual(out_channels, out_channels, norm=norm),
        )
    return stage


class ResNet18(nn.HybridBlock):
    """3x3 stride-1 stem (no max-pool), stages of 64/128/256/512 channels, global average pool, dense."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, norm: Norm = batchnorm):
        super().__init__()
        self.conv = _conv(in_channels, 64, 3, padding=1)
        self.bn = norm(64)
        self.stage1 = _stage(64, 64, first=True, norm=norm)
        self.stage2 = _stage(64, 128, first=False, norm=norm)
        self.stage3 = _stage(128, 256, first=False, norm=norm)
        self.stage4 = _stage(256, 512, first=False, norm=norm)
        self.pool = nn.GlobalAvgPool2D()
        self.fc = nn.Dense(num_classes, in_units=512)  # flattens (N, 512, 1, 1) itself

    def hybrid_forward(self, F, x):
        x = F.relu(self.bn(self.conv(x)))
        x = self.stage4(self.stage3(self.stage2(self.stage1(x))))
        return self.fc(self.pool(x))


class LeNet(nn.HybridBlock):
    """The from-scratch chapter's network: conv3x3(20) relu avgpool, conv5x5(50) relu avgpool, 800-128-10."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1):
        super().__init__()
        self.conv1 = _conv(in_channels, 20, 3)
        self.conv2 = _conv(20, 50, 5)
        self.pool = nn.AvgPool2D(pool_size=2, strides=2)
        self.fc1 = nn.Dense(128, in_units=800)  # flattens (N, 50, 4, 4) itself
        self.fc2 = nn.Dense(num_classes, in_units=128)

    def hybrid_forward(self, F, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        return self.fc2(F.relu(self.fc1(x)))


def _downsample(
    in_channels: int, out_channels: int, stride: int, norm: Norm
) -> nn.HybridSequential:
    """torch's nn.Sequential(conv, bn): its children are named 0 and 1, as in the canonical names."""
    downsample = nn.HybridSequential()
    downsample.add(
        _conv(in_channels, out_channels, 1, stride=stride, bias=False), norm(out_channels)
    )
    return downsample


class Bottleneck(nn.HybridBlock):
    """torchvision's Bottleneck (v1.5: the stride on the 3x3 conv): 1x1, 3x3, 1x1 (4x the planes), bias-free
    convs each followed by BatchNorm; a strided 1x1 conv + BatchNorm (`downsample`) on a changed shortcut."""

    def __init__(
        self,
        in_channels: int,
        planes: int,
        stride: int = 1,
        downsample: bool = False,
        norm: Norm = batchnorm,
    ):
        super().__init__()
        self.conv1 = _conv(in_channels, planes, 1, bias=False)
        self.bn1 = norm(planes)
        self.conv2 = _conv(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = norm(planes)
        self.conv3 = _conv(planes, 4 * planes, 1, bias=False)
        self.bn3 = norm(4 * planes)
        self.downsample = _downsample(in_channels, 4 * planes, stride, norm) if downsample else None

    def hybrid_forward(self, F, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


def _layer(
    in_channels: int, planes: int, blocks: int, stride: int, norm: Norm
) -> nn.HybridSequential:
    layer = nn.HybridSequential()
    layer.add(Bottleneck(in_channels, planes, stride, downsample=True, norm=norm))
    layer.add(*[Bottleneck(4 * planes, planes, norm=norm) for _ in range(blocks - 1)])
    return layer


class ResNet50(nn.HybridBlock):
    """torchvision's resnet50, block for block: 7x7 stride-2 stem, 3x3 stride-2 max-pool, layer1..layer4 of
    3/4/6/3 bottlenecks, global average pool, dense."""

    def __init__(self, num_classes: int = 1000, in_channels: int = 3, norm: Norm = batchnorm):
        super().__init__()
        self.conv1 = _conv(in_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = norm(64)
        # Its output side rounds down, as torch's; after a ReLU every window holds a real value >= 0, so
        # what the padding holds does not change the maximum.
        self.maxpool = nn.MaxPool2D(pool_size=3, strides=2, padding=1)
        channels = 64
        for index, (planes, blocks, stride) in enumerate(RESNET50_LAYERS, start=1):
            setattr(self, f"layer{index}", _layer(channels, planes, blocks, stride, norm))
            channels = 4 * planes
        self.avgpool = nn.GlobalAvgPool2D()
        self.fc = nn.Dense(num_classes, in_units=channels)  # flattens (N, 2048, 1, 1) itself

    def hybrid_forward(self, F, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x))


def resnet18(num_classes: int = 10, in_channels: int = 1, norm: Norm = batchnorm) -> ResNet18:
    return ResNet18(num_classes, in_channels, norm)


def lenet(num_classes: int = 10, in_channels: int = 1) -> LeNet:
    return LeNet(num_classes, in_channels)


def resnet50(num_classes: int = 1000, in_channels: int = 3, norm: Norm = batchnorm) -> ResNet50:
    return ResNet50(num_classes, in_channels, norm)


MODELS = {"resnet18": resnet18, "lenet": lenet, "resnet50": resnet50}


def build(model: str, norm: Norm = batchnorm) -> nn.HybridBlock:
    """The network with the channels and classes of the input it takes (common/architectures.py);
    `norm` makes its BatchNorm layers (LeNet has none)."""
    classes, channels = architectures.num_classes(model), architectures.in_channels(model)
    if model == "lenet":
        return lenet(classes, channels)
    return MODELS[model](classes, channels, norm)


def count_params(net: nn.Block) -> int:
    """Trainable parameters (BatchNorm running statistics have grad_req 'null')."""
    return sum(int(np.prod(p.shape)) for p in net.collect_params().values() if not is_statistic(p))


# ------------------------------------------------------------------ canonical weights

# Gluon's last name component -> the canonical one (only BatchNorm's differ).
GLUON_TO_CANONICAL = {"gamma": "weight", "beta": "bias"}
# Gluon's last name component -> the kind common/weights.py initialises (weights: conv or dense by rank).
KINDS = {
    "gamma": "bn_gamma",
    "beta": "bn_beta",
    "running_mean": "bn_mean",
    "running_var": "bn_var",
    "bias": "bias",
}


def canonical_name(gluon_name: str) -> str:
    """`stage1.0.bn1.gamma` -> `stage1.0.bn1.weight`; every other name is already canonical."""
    block, _, leaf = gluon_name.rpartition(".")
    return f"{block}.{GLUON_TO_CANONICAL.get(leaf, leaf)}"


def _kind(gluon_name: str, shape: tuple[int, ...]) -> str:
    leaf = gluon_name.rpartition(".")[2]
    if leaf == "weight":
        return "conv" if len(shape) == 4 else "dense"
    return KINDS[leaf]


def canonical_params(net: nn.Block) -> dict:
    """{canonical name: gluon Parameter}, BatchNorm running statistics included."""
    return {canonical_name(name): p for name, p in net._collect_params_with_prefix().items()}


def spec(net: nn.Block) -> list[tuple[str, tuple[int, ...], str]]:
    """(canonical name, shape, kind) for every weight common/weights.py initialises."""
    return [
        (canonical_name(name), tuple(p.shape), _kind(name, tuple(p.shape)))
        for name, p in net._collect_params_with_prefix().items()
    ]


def load_canonical(net: nn.Block, weights: dict[str, np.ndarray]) -> None:
    """Copy canonical numpy weights into the network on every context it is initialised on, in the
    network's dtype (float32 or float64 weights into a float64 network: exact)."""
    params = canonical_params(net)
    if set(params) != set(weights):
        raise KeyError(
            f"weights do not match the model: missing {sorted(set(params) - set(weights))[:3]}, "
            f"unexpected {sorted(set(weights) - set(params))[:3]}"
        )
    for name, p in params.items():
        p.set_data(mx.nd.array(weights[name], dtype=p.dtype))


def predict(
    model: str, weights: dict[str, np.ndarray], x: np.ndarray, train: bool, dtype: str
) -> np.ndarray:
    """Logits of `model` with canonical `weights` on a numpy batch, on one CPU context, in `dtype`
    (common/backend.py). train=True: training mode without recording, so BatchNorm normalises with the
    batch's own statistics and nothing changes (MXNet's BatchNorm writes its running statistics in the
    backward pass); else inference mode, with the running statistics."""
    net = build(model)
    net.initialize(ctx=mx.cpu())
    net.cast(dtype)
    load_canonical(net, weights)
    with autograd.train_mode() if train else autograd.predict_mode():
        return net(mx.nd.array(x, dtype=dtype)).asnumpy()


def is_statistic(p) -> bool:
    """BatchNorm running statistics: state, not trained (grad_req 'null')."""
    return p.grad_req == "null"


def to_canonical(*nets: nn.Block) -> dict[str, np.ndarray]:
    """Canonical numpy weights of one network on its contexts, or of replicas of it (one per context),
    in the network's dtype.

    Trainable weights are read from the first context (every context holds the same after a
    step); BatchNorm running statistics are averaged over all contexts, the model evaluation
    uses. Nothing on the devices changes."""
    params = [canonical_params(net) for net in nets]

    def copies(name: str) -> list:
        return [a for p in params for a in p[name].list_data()]

    return {
        name: _mean_on_host(copies(name) if is_statistic(p) else copies(name)[:1])
        for name, p in params[0].items()
    }


def _mean_on_host(arrays: list) -> np.ndarray:
    return np.mean([a.asnumpy() for a in arrays], axis=0, dtype=arrays[0].dtype)


# ------------------------------------------------------------------- what the strategies build and run

LOSS = gluon.loss.SoftmaxCrossEntropyLoss()  # per example; summed per shard


def norm_layers(cfg: RunConfig) -> Norm:
    """The BatchNorm layers of the run's --bn mode. On one context the global batch is that
    context's batch, so sync is plain BatchNorm there (the 1-device run k devices must equal)."""
    return sync_batchnorm(cfg.devices) if cfg.bn == "sync" and cfg.devices > 1 else batchnorm


def statistics_shards(cfg: RunConfig) -> int:
    """How many contexts' shards one BatchNorm layer's statistics cover."""
    return cfg.devices if cfg.bn == "sync" else 1


def network(cfg: RunConfig, ctx, dtype: str) -> gluon.HybridBlock:
    """The model initialised on ctx (a context or a list of them) in dtype, hybridized if the run
    says so (statically with --compile). Gluon's own initial values are overwritten with the canonical
    ones by reset()."""
    net = build(cfg.model, norm_layers(cfg))
    net.initialize(ctx=ctx)
    net.cast(dtype)
    if hybridized(cfg):
        net.hybridize(**hybridize_flags(cfg))
    return net


def trainable(net: gluon.Block) -> list:
    return [p for p in net.collect_params().values() if not is_statistic(p)]


def running_statistics(net: gluon.Block) -> list:
    return [p for p in net.collect_params().values() if is_statistic(p)]


def forward_backward(net, x, y):
    """Summed loss of one shard, its gradients left in the network; (loss sum, correct) handles."""
    with autograd.record():
        logits = net(x)
        loss = LOSS(logits, y).sum()
    loss.backward()
    return loss, (logits.argmax(axis=1).astype(y.dtype) == y).sum()


def accuracy_counts(net, batches, ctx, dtype: str) -> tuple[int, int]:
    correct = total = 0
    for x, y in batches:
        # inference mode
        predicted = net(as_ndarray(np.asarray(x, dtype), ctx)).argmax(axis=1).asnumpy()
        correct += int((predicted.astype(np.int64) == y).sum())
        total += len(y)
    return correct, total
