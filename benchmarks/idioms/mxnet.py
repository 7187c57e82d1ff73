"""MXNet Gluon's idiom: d2l's ResNet-18 as the seed writes it (d2l 12.6, Concise Implementation for
Multiple GPUs: an `nn.Sequential` of d2l's `Residual`, 7.6), Gluon's stock layers, hybridized as d2l
does for speed (12.1, Compilers and Interpreters), trained as d2l's Gluon chapters train (6.6,
`train_ch6`; 13.1, `train_batch_ch13`): batches from a `gluon.data.DataLoader`, each moved to the device
with `as_in_context` (`split_and_load` over one device), `gluon.Trainer` with 'sgd', `SoftmaxCrossEntropyLoss`,
forward and loss under `autograd.record()`, `backward`, `trainer.step(batch_size)` (the mean loss's
SGD step), the mean loss read back with `asscalar()`.

    python -m benchmarks.idioms.mxnet --config run.json --result idiom.json
"""

from __future__ import annotations

import sys

import numpy as np

from benchmarks.idioms import driver
from profilers import mxnet as profiler

import mxnet as mx
from mxnet import autograd, gluon
from mxnet.gluon import nn

FRAMEWORK = f"mxnet {mx.__version__}"


class Residual(nn.HybridBlock):
    """d2l's residual block (d2l.Residual), a HybridBlock so that hybridize() compiles it whole."""

    def __init__(self, num_channels, use_1x1conv=False, strides=1, **kwargs):
        super().__init__(**kwargs)
        self.conv1 = nn.Conv2D(num_channels, kernel_size=3, padding=1, strides=strides)
        self.conv2 = nn.Conv2D(num_channels, kernel_size=3, padding=1)
        self.conv3 = (
            nn.Conv2D(num_channels, kernel_size=1, strides=strides) if use_1x1conv else None
        )
        self.bn1 = nn.BatchNorm()
        self.bn2 = nn.BatchNorm()

    def hybrid_forward(self, F, X):
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3:
            X = self.conv3(X)
        return F.relu(Y + X)


def resnet18(num_classes):
    """d2l's resnet18 for 28x28 images, as the seed writes it."""

    def resnet_block(num_channels, num_residuals, first_block=False):
        blk = nn.Sequential()
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blk.add(Residual(num_channels, use_1x1conv=True, strides=2))
            else:
                blk.add(Residual(num_channels))
        return blk

    net = nn.Sequential()
    net.add(
        nn.Conv2D(64, kernel_size=3, strides=1, padding=1), nn.BatchNorm(), nn.Activation("relu")
    )
    net.add(resnet_block(64, 2, first_block=True), resnet_block(128, 2))
    net.add(resnet_block(256, 2), resnet_block(512, 2))
    net.add(nn.GlobalAvgPool2D(), nn.Dense(num_classes))
    return net


@mx.optimizer.register
class Float64SGD(mx.optimizer.SGD):
    """'sgd' with its step size a double, for float64 runs only: the stock kernels take lr and
    rescale_grad as float32 operator parameters (float32(0.05) is 1.5e-8 off), which would leave a
    float64 run's losses 1e-8 off the suite's. The same update, w <- w - (lr / batch_size) * g."""

    def _update_impl(self, indices, weights, grads, states, multi_precision=False):
        listed = isinstance(indices, (tuple, list))
        indices, weights, grads = ([v] if not listed else v for v in (indices, weights, grads))
        self._update_count(indices)
        for index, weight, grad in zip(indices, weights, grads):
            weight[:] -= (self._get_lr(index) * self.rescale_grad) * grad


HEADS = {"conv": 0, "bn": 1, "fc": -1}  # stageN is net[2 + N], after the stem's relu
BN_NAMES = {"weight": "gamma", "bias": "beta"}  # running_mean, running_var: the same


def gluon_parameter(net: nn.Sequential, canonical: str) -> gluon.Parameter:
    """The network's Parameter of a canonical name (Gluon's layouts are already OIHW, (out, in))."""
    head, *path, name = canonical.split(".")
    block = net[HEADS[head] if head in HEADS else 2 + int(head.removeprefix("stage"))]
    for part in path:
        block = block[int(part)] if part.isdigit() else getattr(block, part)
    if isinstance(block, nn.BatchNorm):
        name = BN_NAMES.get(name, name)
    return getattr(block, name)


def load(net: nn.Sequential, weights: dict, ctx: mx.Context, dtype: str) -> None:
    """Initialize on ctx, resolve the deferred shapes with one zero batch (any image size gives the
    same shapes), then set every parameter to the canonical weights."""
    net.initialize(ctx=ctx)
    net(mx.nd.zeros((1, weights["conv.weight"].shape[1], 28, 28), ctx=ctx, dtype=dtype))
    params = {k: gluon_parameter(net, k) for k in weights}
    if len(set(map(id, params.values()))) != len(net.collect_params().keys()):
        raise ValueError("weights do not fit the network")
    for k, param in params.items():
        param.set_data(mx.nd.array(weights[k], ctx=ctx, dtype=dtype))


def training_step(weights: dict, lr: float, dtype: str, device_kind: str):
    ctx = mx.gpu(0) if device_kind == "gpu" else mx.cpu()
    net = resnet18(10)
    net.cast(dtype)
    load(net, weights, ctx, dtype)
    net.hybridize()
    sgd = "float64sgd" if dtype == "float64" else "sgd"
    trainer = gluon.Trainer(net.collect_params(), sgd, {"learning_rate": lr})
    loss = gluon.loss.SoftmaxCrossEntropyLoss()

    def feed(batches: list):
        """The batches through a Gluon DataLoader, in order (the driver orders them: no shuffle), each moved
        to the device as d2l moves it. num_workers=0: the batches are already in memory."""
        sizes = {len(y) for _, y in batches}
        if len(sizes) != 1:
            raise ValueError(f"the loader re-batches at one batch size, not {sorted(sizes)}")
        images = np.concatenate([x for x, _ in batches]).astype(dtype)
        # the loss picks each row's label with an index in the prediction's dtype
        labels = np.concatenate([y for _, y in batches]).astype(dtype)
        loader = gluon.data.DataLoader(
            gluon.data.ArrayDataset(images, labels), batch_size=sizes.pop(), shuffle=False
        )
        for X, y in loader:
            yield X.as_in_context(ctx), y.as_in_context(ctx)

    def step(batch) -> float:
        X, y = batch
        with autograd.record():
            l = loss(net(X), y)
        l.backward()
        trainer.step(X.shape[0])
        return float(l.mean().asscalar())

    return feed, step


def record(cfg, folder):
    """MXNet's profiler around the profiled steps, as the mxnet backend's runs are recorded."""
    return profiler.record(cfg, folder, 0)


if __name__ == "__main__":
    sys.exit(driver.main(sys.modules[__name__]))
