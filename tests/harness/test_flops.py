"""Model FLOPs and MFU (harness/reporting/flops.py, the summary's TFLOP/s column): counts against a hand count and
published figures (torch's own counter checks them too, tests/backends/test_torch.py), no framework."""

from __future__ import annotations

import pytest

from common.config import RunConfig
from common.levers import Levers
from common.results import Result, new_result
from harness.reporting import flops
from harness.reporting.tables import flops_cell, model_flops, with_scaling


def test_lenet_is_counted_as_by_hand():
    # 3x3 over 28x28 without padding: 26x26 outputs of 20 channels
    conv1 = 2 * 3 * 3 * 1 * 20 * 26 * 26
    conv2 = 2 * 5 * 5 * 20 * 50 * 9 * 9  # after a 2x2 pool (13x13), 5x5: 9x9 outputs of 50 channels
    fc1, fc2 = 2 * 800 * 128, 2 * 128 * 10  # 50 x 4 x 4 after the second pool
    assert flops.forward_flops("lenet", 28) == conv1 + conv2 + fc1 + fc2 == 4_500_720
    assert flops.training_flops("lenet", 28) == 3 * 4_500_720


def test_resnet18_and_resnet50_match_their_published_counts():
    # ResNet-18 on 28x28 Fashion-MNIST: about 2.7 GFLOP per training image (0.91 GFLOP forward)
    assert flops.training_flops("resnet18", 28) == pytest.approx(2.7e9, rel=0.02)
    # torchvision's ResNet-50 at 224: 4.09 G multiply-adds (torchvision's model table, "GFLOPS 4.09")
    assert flops.forward_flops("resnet50", 224) / 2 == pytest.approx(4.09e9, rel=0.001)


def test_a_peak_is_known_only_for_a_named_gpu_and_precision():
    assert flops.peak_tflops("NVIDIA H200", "bf16") == 989.5
    assert flops.peak_tflops("NVIDIA A100-SXM4-80GB", "tf32") == 156
    assert flops.peak_tflops("Tesla V100-SXM2-16GB", "bf16") is None
    assert flops.peak_tflops("cpu (simulated device 0)", "fp32") is None


def row_of(
    devices: int, images_per_s: float, device: str, simulated: bool, precision: str = "bf16"
):
    cfg = RunConfig(
        backend="torch",
        strategy="ddp",
        devices=devices,
        batch_size=32 * devices,
        simulated=simulated,
        levers=Levers(precision=precision),
        device_kind="cpu" if simulated else "gpu",
    ).to_dict()
    epoch = {
        "epoch": 1,
        "time_s": 1.0,
        "steps": 1,
        "images": images_per_s,
        "images_per_s": images_per_s,
        "train_loss": 1.0,
        "train_acc": 0.5,
        "test_acc": 0.5,
    }
    result = {
        **new_result(cfg, "ok"),
        "epochs": [epoch],
        "environment": {"devices": [device] * devices},
    }
    return with_scaling([Result.from_dict(result)])[0]


def test_the_summary_gives_achieved_tflops_and_the_share_of_the_gpus_peak():
    row = row_of(2, 100_000, "NVIDIA H100 80GB HBM3", simulated=False)
    achieved, mfu = model_flops(row)
    assert achieved == pytest.approx(flops.training_flops("resnet18", 28) * 100_000 / 1e12)
    assert mfu == pytest.approx(achieved / (2 * 989.5))
    assert flops_cell(row) == f"{achieved:.3g} ({mfu:.1%})"
    cpu = row_of(1, 50, "cpu (simulated device 0)", simulated=True, precision="fp32")
    assert flops_cell(cpu).endswith("(no peak known)") and model_flops(cpu)[1] is None
