"""PyTorch's idiom: d2l's ResNet-18 as the seed writes it (an `nn.Sequential` of d2l's `Residual`), trained
with `nn.CrossEntropyLoss` and `torch.optim.SGD`, the loop of PyTorch's ImageNet example
(github.com/pytorch/examples, imagenet/main.py: `train`): batches from a `torch.utils.data.DataLoader` with
`pin_memory=True` on a GPU, each copied to the device with `non_blocking=True`, forward, loss, `zero_grad`,
`backward`, `step`, `loss.item()`. On a GPU, `cudnn.benchmark` as that example sets it.

    python -m benchmarks.idioms.torch --config run.json --result idiom.json
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.idioms import driver
from profilers import torch as profiler

FRAMEWORK = f"torch {torch.__version__}"


class Residual(nn.Module):
    """d2l's residual block (d2l.Residual)."""

    def __init__(self, input_channels, num_channels, use_1x1conv=False, strides=1):
        super().__init__()
        self.conv1 = nn.Conv2d(input_channels, num_channels, 3, padding=1, stride=strides)
        self.conv2 = nn.Conv2d(num_channels, num_channels, 3, padding=1)
        self.conv3 = (
            nn.Conv2d(input_channels, num_channels, 1, stride=strides) if use_1x1conv else None
        )
        self.bn1 = nn.BatchNorm2d(num_channels)
        self.bn2 = nn.BatchNorm2d(num_channels)

    def forward(self, X):
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3:
            X = self.conv3(X)
        return F.relu(Y + X)


def resnet18(num_classes=10, in_channels=1):
    """d2l's resnet18 for 28x28 images, as the seed writes it."""

    def resnet_block(in_channels, out_channels, num_residuals, first_block=False):
        blk = []
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blk.append(Residual(in_channels, out_channels, use_1x1conv=True, strides=2))
            else:
                blk.append(Residual(out_channels, out_channels))
        return nn.Sequential(*blk)

    net = nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
    )
    net.add_module("resnet_block1", resnet_block(64, 64, 2, first_block=True))
    net.add_module("resnet_block2", resnet_block(64, 128, 2))
    net.add_module("resnet_block3", resnet_block(128, 256, 2))
    net.add_module("resnet_block4", resnet_block(256, 512, 2))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
    return net


def d2l_name(canonical: str) -> str:
    """The seed's module path of a canonical parameter: conv -> 0, bn -> 1, stageN -> resnet_blockN,
    fc -> fc.1 (layouts are torch's already)."""
    head, rest = canonical.split(".", 1)
    head = {"conv": "0", "bn": "1", "fc": "fc.1"}.get(head, head.replace("stage", "resnet_block"))
    return f"{head}.{rest}"


def load(net: nn.Module, weights: dict) -> None:
    state = {d2l_name(k): torch.from_numpy(v) for k, v in weights.items()}
    missing, unexpected = net.load_state_dict(state, strict=False)
    if unexpected or any(not k.endswith("num_batches_tracked") for k in missing):
        raise ValueError(f"weights do not fit the network: {unexpected or missing}")


def training_step(weights: dict, lr: float, dtype: str, device_kind: str):
    device = torch.device("cuda" if device_kind == "gpu" else "cpu")
    torch.backends.cudnn.benchmark = True
    net = resnet18().to(getattr(torch, dtype))
    load(net, weights)
    net = net.to(device)
    net.train()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr)

    def feed(batches: list):
        """The batches through a DataLoader, in order (the driver orders them: no shuffle), each copied to the
        device as the example copies it. num_workers=0: the batches are already in memory, so the example's
        decoding workers would have nothing to do; with no workers the loader pins each batch in this process
        when it is taken, before its step's timer. pin_memory only on a GPU, as on the CPU torch warns that
        it does nothing."""
        sizes = {len(y) for _, y in batches}
        if len(sizes) != 1:
            raise ValueError(f"the loader re-batches at one batch size, not {sorted(sizes)}")
        size = sizes.pop()
        images = torch.from_numpy(np.concatenate([x for x, _ in batches]))
        targets = torch.from_numpy(np.concatenate([y for _, y in batches])).long()
        loader = DataLoader(
            TensorDataset(images, targets),
            batch_size=size,
            shuffle=False,
            num_workers=0,
            pin_memory=device.type == "cuda",
        )
        for x, y in loader:
            yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    def step(batch) -> float:
        images, target = batch
        output = net(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()

    return feed, step


def record(cfg, folder):
    """torch.profiler around the profiled steps, as the torch backend's runs are recorded."""
    return profiler.record(cfg, folder, 0)


if __name__ == "__main__":
    sys.exit(driver.main(sys.modules[__name__]))
