"""Model FLOPs per image, counted from the architecture (no framework), and the peak a known GPU offers.

A training image costs 3 x its forward FLOPs: the forward pass, and a backward pass of twice that (the
gradients with respect to the activations and to the weights), the convention of MFU (PaLM, appendix B).
Counted are the multiply-adds of convolutions and dense layers, 2 FLOPs each; BatchNorm, ReLU, pooling,
additions and biases are left out (under 1% of ResNet-18's total, and no peak is quoted for them).
"""

from __future__ import annotations

from common import architectures
from common.architectures import RESNET50_LAYERS


def out_side(side: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    return (side + 2 * padding - kernel) // stride + 1


def conv(in_ch: int, out_ch: int, kernel: int, side_out: int) -> int:
    return 2 * kernel * kernel * in_ch * out_ch * side_out * side_out


def dense(in_f: int, out_f: int) -> int:
    return 2 * in_f * out_f


def resnet18_forward(side: int, in_ch: int, classes: int) -> int:
    """d2l's ResNet-18: 3x3 stride-1 stem, stages of two residual blocks (the first of stages 2-4 strided)."""
    total = conv(in_ch, 64, 3, side)
    channels = 64
    for stage, out_ch in enumerate((64, 128, 256, 512)):
        side = out_side(side, 3, 1 if stage == 0 else 2, 1)
        total += conv(channels, out_ch, 3, side) + conv(out_ch, out_ch, 3, side)  # first block
        total += conv(channels, out_ch, 1, side) if stage else 0  # its 1x1 shortcut
        total += 2 * conv(out_ch, out_ch, 3, side)  # second block
        channels = out_ch
    return total + dense(512, classes)


def lenet_forward(side: int, in_ch: int, classes: int) -> int:
    """conv3x3(20), 2x2 pool, conv5x5(50), 2x2 pool, 800-128-classes."""
    side1 = out_side(side, 3)
    side2 = out_side(side1 // 2, 5)
    return (
        conv(in_ch, 20, 3, side1)
        + conv(20, 50, 5, side2)
        + dense(50 * (side2 // 2) ** 2, 128)
        + dense(128, classes)
    )


def resnet50_forward(side: int, in_ch: int, classes: int) -> int:
    """torchvision's v1.5: 7x7 stride-2 stem, 3x3 stride-2 max-pool, bottlenecks strided on their 3x3 conv."""
    side = out_side(side, 7, 2, 3)
    total = conv(in_ch, 64, 7, side)
    side = out_side(side, 3, 2, 1)
    channels = 64
    for planes, blocks, stride in RESNET50_LAYERS:
        for block in range(blocks):
            s = stride if block == 0 else 1
            out = out_side(side, 3, s, 1)
            total += (
                conv(channels, planes, 1, side)
                + conv(planes, planes, 3, out)
                + conv(planes, 4 * planes, 1, out)
            )
            total += conv(channels, 4 * planes, 1, out) if block == 0 else 0  # the downsample
            channels, side = 4 * planes, out
    return total + dense(2048, classes)


FORWARD = {"resnet18": resnet18_forward, "lenet": lenet_forward, "resnet50": resnet50_forward}


def forward_flops(model: str, side: int) -> int:
    """One image's forward FLOPs at `side` x `side` pixels."""
    return FORWARD[model](side, architectures.in_channels(model), architectures.num_classes(model))


def training_flops(model: str, side: int) -> int:
    """One training image: forward and backward."""
    return 3 * forward_flops(model, side)


# Dense peak TFLOP/s per precision of the GPUs a report may name (datasheets, SXM parts, without sparsity).
# fp32 runs count as "fp32" (no TF32: the harness turns it off), tf32 and bf16 as themselves.
PEAKS = {
    "H200": {"fp32": 67, "tf32": 494.5, "bf16": 989.5},
    "H100": {"fp32": 67, "tf32": 494.5, "bf16": 989.5},
    "A100": {"fp32": 19.5, "tf32": 156, "bf16": 312},
    "V100": {"fp32": 15.7, "tf32": None, "bf16": None},
}
PEAKS_SOURCE = "NVIDIA's datasheets (H100/H200 SXM, A100 SXM, V100 SXM2), dense, without sparsity"


def peak_tflops(device_name: str, precision: str) -> float | None:
    """The peak of the first known GPU named in `device_name` at `precision`; None if none is known."""
    for chip, peaks in PEAKS.items():
        if chip in device_name.upper():
            return peaks.get(precision)
    return None
