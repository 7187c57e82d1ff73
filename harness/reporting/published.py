"""Published figures a report puts beside its own: d2l's for ResNet-18 and LeNet, NVIDIA's for ResNet-50.

Each figure is quoted with its source, so a reader can check it, and compared only with runs on the same kind of
device (a measured 1-GPU run of ResNet-50 on a chip the table names).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.results import Result
from harness.reporting.tables import device_name, fmt, table

# d2l's published figures (10 epochs, V100-class GPUs, FP32, test accuracy of the last epoch).
D2L_REFERENCE = [
    (
        "ResNet-18, MXNet Gluon Trainer (bs 256/lr 0.1, then bs 512/lr 0.2)",
        "13.1 s/epoch, 0.93",
        "6.8 s/epoch, 0.92",
    ),
    ("ResNet-18, PyTorch nn.DataParallel", "12.2-14.2 s/epoch, 0.91", "7.5-9.3 s/epoch, 0.73-0.86"),
    ("LeNet from scratch, PyTorch (bs 256, lr 0.2)", "3.0 s/epoch, 0.83", "2.8 s/epoch, 0.84"),
]

NVIDIA_RESNET50_SOURCE = (
    "NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "
    '"Training performance results" (pytorch-21.03 NGC container, batch 256 per GPU)'
)


@dataclass(frozen=True)
class Throughput:
    chip: str  # as the device's name spells it, e.g. "A100"
    system: str
    precision: str  # the published column: TF32, FP32 or mixed precision (AMP, float16)
    images_per_s: float


# Single-GPU ResNet-50 v1.5 training throughput, PyTorch. No single-GPU figure for H100 or H200 is published in the
# same form; the table says so rather than scale another chip's figure.
RESNET50_ONE_GPU = [
    Throughput("A100", "DGX A100 (A100 80GB)", "mixed precision", 2470),
    Throughput("A100", "DGX A100 (A100 80GB)", "TF32", 938),
    Throughput("V100", "DGX-1 (V100 16GB)", "mixed precision", 1200),
    Throughput("V100", "DGX-1 (V100 16GB)", "FP32", 367),
]


@dataclass(frozen=True)
class Scaling:
    """A published weak-scaling figure: one GPU's and several GPUs' throughput at the same per-GPU batch."""

    system: str
    profile: str  # the interconnect of harness/reporting/scaling.py's PROFILES it ran on
    precision: str
    one_gpu: float
    gpus: int
    many_gpus: float

    @property
    def efficiency(self) -> float:
        return self.many_gpus / (self.gpus * self.one_gpu)


# ResNet-50 v1.5 with PyTorch DistributedDataParallel, batch 256 per GPU (the same source and table as above; its
# "strong scaling" column keeps the per-GPU batch, which is weak scaling in this suite's words).
RESNET50_BATCH = 256
RESNET50_8GPU = [
    Scaling("DGX A100 (8x A100 80GB)", "dgx-a100", "TF32", 938, 8, 7248),
    Scaling("DGX A100 (8x A100 80GB)", "dgx-a100", "mixed precision", 2470, 8, 16621),
    Scaling("DGX-1 (8x V100 16GB)", "dgx1-v100", "FP32", 367, 8, 2855),
    Scaling("DGX-1 (8x V100 16GB)", "dgx1-v100", "mixed precision", 1200, 8, 8322),
    Scaling("DGX-1 (8x V100 32GB)", "dgx1-v100", "FP32", 356, 8, 2766),
    Scaling("DGX-1 (8x V100 32GB)", "dgx1-v100", "mixed precision", 1156, 8, 8056),
]


def d2l_section() -> list[str]:
    return (
        [
            "## d2l reference numbers",
            "",
            "Published by d2l.ai (10 epochs, V100-class GPUs, FP32, test accuracy of the last epoch); "
            "compare with a GPU run of the d2l preset, not with simulated CPU devices.",
            "",
        ]
        + table(["run", "1 GPU", "2 GPUs"], [list(r) for r in D2L_REFERENCE])
        + [""]
    )


def published_for(name: str) -> list[Throughput]:
    return [t for t in RESNET50_ONE_GPU if t.chip in name]


def resnet50_section(results: list[Result]) -> list[str]:
    """NVIDIA's single-GPU figures, and each measured 1-GPU run of a chip they name, as a fraction of the best."""
    L = [
        "## Published reference (ResNet-50 v1.5, one GPU)",
        "",
        f"Training throughput published by {NVIDIA_RESNET50_SOURCE}. Compare with a GPU run of the resnet50 "
        "preset (bf16, batch 256 per device), never with simulated CPU devices.",
        "",
    ]
    L += table(
        ["GPU", "system", "precision", "images/s"],
        [[t.chip, t.system, t.precision, f"{t.images_per_s:,.0f}"] for t in RESNET50_ONE_GPU],
    ) + [""]
    measured = [
        r for r in results if r.ok and r.config.devices == 1 and not r.config.simulated and r.epochs
    ]
    lines = []
    for r in measured:
        name, speed = device_name(r), r.epochs[-1].images_per_s
        best = max(published_for(name), key=lambda t: t.images_per_s, default=None)
        if best is None:
            lines.append(
                f"- {r.config.backend} {r.config.variant} on {name or 'its GPU'}: "
                f"{fmt(speed, ',.0f')} images/s; the table has no figure for this GPU."
            )
        else:
            lines.append(
                f"- {r.config.backend} {r.config.variant} on {name}: {fmt(speed, ',.0f')} images/s, "
                f"{speed / best.images_per_s:.0%} of the published {best.images_per_s:,.0f} "
                f"({best.precision})."
            )
    return L + (lines + [""] if lines else [])
