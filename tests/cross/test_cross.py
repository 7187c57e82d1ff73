"""Across backends (run by `python -m harness test` in a lane beside the backends' own suites, in the harness
environment): the equivalence check passes, and a checkpoint from one backend evaluates the same in all."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from common import weights
from harness.processes.devices import detect
from harness.processes.envs import worker_env

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = [b for b in os.environ.get("DPBENCH_BACKENDS", "").split(",") if b]
PYTHONS = [
    a
    for item in os.environ.get("DPBENCH_PYTHONS", "").split(",")
    if item
    for a in ("--python", item)
]

pytestmark = pytest.mark.skipif(
    len(BACKENDS) < 2, reason="needs two backends: run by python -m harness test"
)


def harness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args, *PYTHONS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=worker_env(),
        timeout=1500,
    )


# One strategy a backend, each its framework's own data-parallel engine (torch's ddp, the reference; jax's pmap;
# Keras's ddp; MXNet's Gluon Trainer): every other strategy takes the same steps as these in float64 and within
# float32's rounding (tests/backends/test_contract.py's test_strategies_agree_in_float64 and
# test_k_device_step_in_float32_is_within_float32_rounding), so it agrees with torch through them. Every strategy
# here took 58 s of CPU a pass; these take 38 s.
CHECKED_STRATEGIES = "ddp,pmap,gluon"


@pytest.mark.rounding
def test_equivalence_check_passes_for_lenet():
    out = harness(
        "check",
        "--backend",
        ",".join(BACKENDS),
        "--strategy",
        CHECKED_STRATEGIES,
        "--device",
        "cpu",
        "--gpus",
        "1,2",
        "--model",
        "lenet",
        "--bn",
        "local",
        "--steps",
        "3",
        "--batch-size",
        "8",
        "--dataset",
        "synthetic",
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    rows = [
        line
        for line in out.stdout.splitlines()
        if line.startswith("| ") and "| check |" not in line
    ]
    for backend in BACKENDS:
        assert any(f"| {backend} |" in r for r in rows), backend
    forward = [r for r in rows if r.startswith("| forward |")]
    others = [
        b for b in BACKENDS if b != "torch"
    ]  # (torch, the reference, is checked whatever is asked)
    assert len(forward) == 2 * len(others)  # train and eval mode, every backend vs torch
    assert all(r.rstrip(" |").endswith("ok") or "| ok" in r for r in forward)
    # in float64 the backends compute the same loss and gradients as torch to rounding of float64
    math = [r.split(" | ") for r in rows if r.startswith("| math (float64) |")]
    assert len(math) == len(others)
    assert all(float(cells[6]) <= 1e-12 and cells[8].startswith("ok") for cells in math), math


def test_mxnets_resnet50_computes_torchs_in_float64():
    """torchvision's ResNet-50 (the torch backend's is proven against torchvision itself) computes the same loss
    and gradients in MXNet as in torch, in float64, on synthetic 64x64 images, and the check passes. A backend's
    float64 row is its reference strategy's (strategies.py's REFERENCE): jax's and Keras's (Keras's distribution)
    are XLA programs, which take minutes to compile on a small CPU (Keras's was most of this test's 212 s), so
    their ResNet-50 rows are proven by `harness check --model resnet50` on demand (docs/equivalence.md gives its
    figures). Only the float64 rows are judged here (float32 is a rounding claim, tested on LeNet above). Each
    row names the float64 floor torch measured by running again with its images permuted: a real one, not 0. The
    images are 32 x 32, ResNet-50's smallest (the check's 64 x 64 took 12% more CPU time)."""
    if "mxnet" not in BACKENDS:
        pytest.skip("needs MXNet beside torch")
    out = harness(
        "check",
        "--backend",
        "torch,mxnet",
        "--device",
        "cpu",
        "--gpus",
        "1",
        "--model",
        "resnet50",
        "--bn",
        "local",
        "--steps",
        "1",
        "--batch-size",
        "4",
        "--init",
        "he",
        "--image-size",
        "32",
        # the eager strategies: torch's ddp (a strategy of torch's is measured beside its reference) and gluon
        "--strategy",
        "ddp,gluon",
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "synthetic, ImageNet-shaped 32x32" in out.stdout, out.stdout[-3000:]
    # the model's math and gluon's step, both in float64
    rows = [line.split(" | ") for line in out.stdout.splitlines() if "math (float64) |" in line]
    assert [cells[2] for cells in rows] == ["mxnet", "mxnet"], out.stdout[-3000:]
    assert all(float(cells[6]) <= 1e-10 and cells[8].startswith("ok") for cells in rows), rows
    floors = [re.search(r"float64 floor ([-+.e0-9]+)\)", cells[8]) for cells in rows]
    assert all(f and 0 < float(f.group(1)) < 1e-10 for f in floors), rows


@pytest.mark.skipif(not detect().gpus, reason="needs a GPU")
def test_equivalence_check_passes_on_the_gpu():
    """On a GPU the check's float32 rows run at full precision (TF32 off: its 1e-4 forward rows would fail
    otherwise) and its float64 references on the CPU; every backend that can use the GPU passes, 1 device."""
    out = harness(
        "check",
        "--backend",
        ",".join(BACKENDS),
        "--device",
        "gpu",
        "--gpus",
        "1",
        "--model",
        "lenet",
        "--bn",
        "local",
        "--steps",
        "3",
        "--batch-size",
        "8",
        "--dataset",
        "synthetic",
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    rows = [
        line
        for line in out.stdout.splitlines()
        if line.startswith("| ") and "| check |" not in line
    ]
    assert not [r for r in rows if "| failed" in r], rows
    ran = [r for r in rows if r.rstrip(" |").endswith("ok") or "| ok" in r]
    assert any("| torch |" in r for r in ran) and any("| jax |" in r for r in ran), rows


@pytest.mark.rounding
def test_checkpoint_from_one_backend_evaluates_the_same_everywhere(tmp_path):
    common = [
        "--device",
        "cpu",
        "--model",
        "lenet",
        "--dataset",
        "synthetic",
        "--test-size",
        "200",
        "--quiet",
        "--no-check",
    ]
    ckpt, start = tmp_path / "lenet.npz", tmp_path / "start.npz"
    # d2l's N(0, 0.01) LeNet needs thousands of steps to leave chance
    weights.save(start, weights.initial_weights("lenet", 0, init="he"))
    trained = harness(
        "--backend",
        "torch",
        "--strategy",
        "scratch",
        "--gpus",
        "1",
        "--epochs",
        "2",
        "--train-size",
        "1024",
        "--batch-size",
        "32",
        "--lr",
        "0.1",
        "--load-weights",
        str(start),
        "--save-weights",
        str(ckpt),
        "--out",
        str(tmp_path / "train"),
        *common,
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    (report,) = (tmp_path / "train").iterdir()
    run = json.loads((report / "results.json").read_text())["runs"][0]
    assert run["saved_weights"]["path"] == str(ckpt) and ckpt.is_file()
    accuracies = {"torch (trained)": run["final_test_acc"]}
    for backend in BACKENDS:
        out = harness(
            "--backend",
            backend,
            "--gpus",
            "1",
            "--epochs",
            "0",
            "--load-weights",
            str(ckpt),
            "--batch-size",
            "8",
            "--train-size",
            "64",
            "--out",
            str(tmp_path / backend),
            *common,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        (report,) = (tmp_path / backend).iterdir()
        runs = [
            r
            for r in json.loads((report / "results.json").read_text())["runs"]
            if r["status"] != "unavailable"
        ]  # (e.g. torch dp without CUDA)
        assert runs, backend
        for r in runs:
            assert r["status"] == "ok", r["error"]
            assert r["epochs"] == [] and r["weights_hash"] == run["saved_weights"]["sha256"]
            accuracies[f"{backend} {r['config']['strategy']}"] = r["final_test_acc"]
    assert 0.3 < accuracies["torch (trained)"] <= 1.0, accuracies  # it learned something
    assert len(set(accuracies.values())) == 1, accuracies


def test_parity_times_a_strategy_beside_its_idiom_and_reports_the_ratio(tmp_path):
    """`python -m harness parity` end to end, on the real framework (torch, the quickest): both sides
    finish every trial, the ratio and its interval are in the report and in results.json, and the report's
    folder keeps nothing of its staging."""
    out = tmp_path / "reports"
    proc = harness(
        "parity",
        *("--backend", "torch", "--strategy", "scratch", "--device", "cpu"),
        *("--repeat", "2", "--max-trials", "2", "--timed-steps", "3", "--batch-size", "8"),
        *("--dataset", "synthetic"),
        *("--out", str(out), "--quiet"),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (folder,) = out.iterdir()
    (row,) = json.loads((folder / "results.json").read_text())["parity"]["rows"]
    assert row["trials"] == [2, 2] and row["idiom"] == "torch"
    low, high = row["interval"]
    assert 0 < low <= row["ratio"] <= high
    text = (folder / "report.md").read_text()
    assert f"| torch | scratch | torch ({row['framework']}) |" in text
    # both sides' first trials profiled (--profile 3 by default): the breakdowns a reason is read from
    assert set(row["breakdown"]) == {"strategy", "idiom"}
    assert (
        row["breakdown"]["strategy"]["conv_matmul"] > 0
        and row["breakdown"]["idiom"]["conv_matmul"] > 0
    )
    traces = sorted(p.name for p in (folder / "traces").iterdir())
    assert traces == ["idiom-torch-trial1", "torch-scratch-x1-trial1"]
    assert sorted(p.name for p in folder.iterdir()) == [
        "accuracy.png",
        "breakdown.png",
        "logs",
        "parity.png",
        "report.md",
        "results.json",
        "traces",
    ]


@pytest.mark.skipif("torch" not in BACKENDS, reason="runs on torch, the quickest")
def test_the_lenet_preset_reaches_a_target_on_the_real_fashion_mnist(tmp_path):
    """--preset lenet-target end to end on the real data, all 60,000 training images (torch, the quickest), with its
    target lowered to what one epoch reaches (0.75; the preset's 0.85 takes 4 to 6 epochs, about two minutes a
    backend on 2 cores: docs/time-to-accuracy.md's reference run): the run stops after epoch 1 of its 3, with its
    time to target, and its MLPerf log says it succeeded."""
    out = tmp_path / "reports"
    proc = harness(
        *("--backend", "torch", "--strategy", "scratch", "--gpus", "1", "--device", "cpu"),
        *("--preset", "lenet-target", "--target-accuracy", "0.75", "--epochs", "3"),
        *("--timed-steps", "0", "--no-check", "--out", str(out), "--quiet"),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (folder,) = out.iterdir()
    results = json.loads((folder / "results.json").read_text())
    (run,) = results["runs"]
    assert run["config"]["dataset"] == "fashion-mnist"
    assert run["train_examples"] == 60_000 and run["test_examples"] == 10_000
    assert [e["epoch"] for e in run["epochs"]] == [1]
    assert run["epochs"][0]["test_acc"] >= 0.75
    target = run["target"]
    assert target["reached"] and target["epoch"] == 1
    assert target["train_s"] == pytest.approx(run["epochs"][0]["time_s"])
    assert 0 < target["train_s"] < target["wall_s"]
    mllog = (folder / run["mllog"]).read_text()
    assert '"key": "run_stop"' in mllog and '"status": "success"' in mllog


@pytest.mark.skipif("torch" not in BACKENDS, reason="TorchInductor's cache is torch's")
def test_torchs_second_trial_finds_what_its_first_compiled_in_a_shared_cache(tmp_path):
    """TorchInductor keeps what it compiles in the folder the harness gives it: with --compile-cache the second
    trial of a `--compile` run finds what the first compiled, the first found nothing. Without it each trial gets
    a fresh folder of its own (tests/harness/test_caches.py), so each compiles cold: the folders given are the
    ones TorchInductor uses, which this test is here to prove on the real framework. These are the suite's
    torch.compile runs: each compiles in its warm-up only (test_contract's test_only_the_warm_up_compiles holds the
    strategies that compile without --compile to it)."""
    out = tmp_path / "reports"
    proc = harness(
        *("--backend", "torch", "--strategy", "scratch", "--gpus", "1", "--device", "cpu"),
        *("--model", "lenet", "--dataset", "synthetic", "--train-size", "32"),
        *("--test-size", "16", "--batch-size", "16", "--epochs", "1", "--timed-steps", "0"),
        *("--compile", "--repeat", "2", "--no-check", "--quiet", "--out", str(out)),
        *("--compile-cache", str(tmp_path / "shared")),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (report,) = out.iterdir()
    runs = json.loads((report / "results.json").read_text())["runs"]
    first, second = [r["environment"]["compile_cache"]["files_at_start"] for r in runs]
    assert first == 0 and second > 0
    for r in runs:
        assert r["compiles"]["warmup"] > 0, r["compiles"]
        assert r["compiles"]["epochs"] == r["compiles"]["timed_steps"] == 0, r["compiles"]
