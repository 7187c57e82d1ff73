"""The equivalence table's comparisons, on hand-made measurements (no framework needed)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from common import architectures, checkjob, weights
from common import measurements as measurements_lib
from common.backend import Probe
from harness.checking import equivalence, workers
from tests.harness.helpers import fake_python
from tests.harness.test_runner import processes_with


def measurements(
    model: str,
    w0: dict,
    scale: float = 0.0,
    runs=((("ddp", 1, "local")), ("ddp", 2, "local")),
    state_scale: float = 0.0,
):
    """What a backend's check worker writes; `scale` perturbs everything by that much, `state_scale` the
    BatchNorm running variances only (another convention for them)."""
    out = {
        f"{model}|forward|train": np.ones((4, 10)) + scale,
        f"{model}|forward|eval": np.ones((4, 10)),
    }
    for strategy, k, bn in runs:
        key = f"{model}|{strategy}|{k}|{bn}"
        out[f"{key}|loss"] = np.float64(2.3 * (1 + scale))
        out[f"{key}|losses"] = np.full(3, 2.3) + scale
        for name, shape, kind in architectures.spec(model):
            if kind == "bn_mean":
                out[f"{key}|first|{name}"] = out[f"{key}|final|{name}"] = np.full(shape, 0.2) * (
                    1 + scale
                )
                continue
            if kind == "bn_var":
                out[f"{key}|first|{name}"] = out[f"{key}|final|{name}"] = np.full(
                    shape, 0.9
                ) + 0.1 * (1 + state_scale)
                continue
            out[f"{key}|grad|{name}"] = np.full(shape, 0.5) * (1 + scale)
            out[f"{key}|first|{name}"] = (
                w0[name] - 0.05 * (1 + scale) + (1e-3 if k == 2 and bn == "local" else 0)
            )
            out[f"{key}|final|{name}"] = w0[name] - 0.15 * (1 + scale)
    return out


def as_float64_runs(arrays: dict) -> dict:
    """The same measurements stored as each strategy's float64 run (common/measurements.py: <strategy>:float64)."""
    out = {}
    for key, value in arrays.items():
        parts = key.split("|")
        if len(parts) >= 5 and parts[1] not in ("forward", "float64"):
            parts[1] += checkjob.FLOAT64
            out["|".join(parts)] = value
    return out


def by(rows, **kw):
    return [r for r in rows if all(getattr(r, k) == v for k, v in kw.items())]


def test_identical_measurements_pass_and_perturbed_ones_fail():
    w0 = {"lenet": weights.initial_weights("lenet", 0)}
    rows = equivalence.compare(
        {
            "torch": (measurements("lenet", w0["lenet"]), {}),
            "jax": (measurements("lenet", w0["lenet"]), {}),
            "mxnet": (
                measurements("lenet", w0["lenet"], scale=1e-2),
                {"lenet|scratch|2|sync": "no"},
            ),
        },
        w0,
    )
    assert all(r.status == "ok" for r in by(rows, backend="jax") if r.check != "k vs 1 device")
    assert by(rows, backend="mxnet", check="gradients")[0].status == "FAIL"
    assert (
        abs(by(rows, backend="mxnet", check="forward", strategy="(train mode)")[0].value - 1e-2)
        < 1e-12
    )
    assert by(rows, backend="mxnet", check="forward", strategy="(eval mode)")[0].status == "ok"
    # LeNet k vs 1: the planted 1e-3 difference at 2 devices fails the 1e-5 tolerance
    assert by(rows, backend="jax", check="k vs 1 device")[0].status == "FAIL"
    assert by(rows, backend="mxnet", status="not run")[0].note == "no"


def test_the_forward_rows_allow_the_references_own_float32_rounding_of_the_logits():
    """ResNet-50's 1,000 logits round further than the fixed 1e-4: with torch's float64 logits measured, a
    difference within 3x torch's own float32-vs-float64 distance is rounding; beyond it, or without them, it fails."""
    w0 = {"lenet": weights.initial_weights("lenet", 0)}
    torch, other = measurements("lenet", w0["lenet"]), measurements("lenet", w0["lenet"])
    other["lenet|forward|train"] = torch["lenet|forward|train"] + 5e-4

    def forward_row(torch_error):
        exact = (
            {}
            if torch_error is None
            else {
                "lenet|float64|forward|train": torch["lenet|forward|train"] - torch_error,
                "lenet|float64|forward|eval": torch["lenet|forward|eval"],
            }
        )
        rows = equivalence.compare({"torch": ({**torch, **exact}, {}), "jax": (other, {})}, w0)
        return by(rows, backend="jax", check="forward", strategy="(train mode)")[0]

    assert forward_row(None).status == "FAIL" and forward_row(None).tolerance == 1e-4
    row = forward_row(3e-4)
    assert row.status.startswith(
        "ok (3x float32-vs-float64 3.0e-04)"
    ) and row.tolerance == pytest.approx(9e-4)
    assert forward_row(1e-4).status.startswith("FAIL")  # 5e-4 is more than 3x a rounding of 1e-4


def test_resnet_per_device_batchnorm_difference_is_measured_not_failed():
    w0 = {"resnet18": weights.initial_weights("resnet18", 0)}
    runs = (("ddp", 1, "local"), ("ddp", 2, "local"))
    rows = equivalence.compare(
        {"torch": (measurements("resnet18", w0["resnet18"], runs=runs), {})}, w0
    )
    (k_vs_1,) = by(rows, check="k vs 1 device")
    assert k_vs_1.status == "measured" and abs(k_vs_1.value - 1e-3) < 1e-8
    row = "| k vs 1 device | resnet18 | torch | ddp | 2 | local | 1.00e-03 | — | measured"
    assert row in "\n".join(equivalence.table(rows))


def with_float64(
    arrays: dict,
    model: str,
    runs,
    grad_error: float,
    trace_error: float = 0.0,
    math_error: float = 0.0,
):
    """Add what the reference worker writes in float64: the float32 runs are `grad_error` away from it."""
    out = dict(arrays)
    for strategy, k, bn in runs:
        key, f64 = f"{model}|{strategy}|{k}|{bn}", f"{model}|float64|{k}|{bn}"
        out[f"{f64}|loss"] = arrays[f"{key}|loss"]
        out[f"{f64}|losses"] = arrays[f"{key}|losses"] + trace_error
        for name in equivalence._trainable(model):
            out[f"{f64}|grad|{name}"] = arrays[f"{key}|grad|{name}"] * (1 + grad_error)
        for name in equivalence._trainable(model) + equivalence._statistics(model):
            out[f"{f64}|first|{name}"] = arrays[f"{key}|first|{name}"]
            out[f"{f64}|final|{name}"] = arrays[f"{key}|final|{name}"]
    out[f"{model}|float64|loss"] = np.float64(2.3 * (1 + math_error))
    for name in equivalence._trainable(model):
        out[f"{model}|float64|grad|{name}"] = np.full(w0_shape(model, name), 0.5) * (1 + math_error)
    return out


def w0_shape(model: str, name: str) -> tuple:
    return next(shape for n, shape, _ in architectures.spec(model) if n == name)


def test_float32_rounding_widens_the_tolerance_but_different_math_still_fails():
    w0 = {"resnet18": weights.initial_weights("resnet18", 0)}
    runs = (("ddp", 1, "local"),)
    torch = with_float64(
        measurements("resnet18", w0["resnet18"], runs=runs), "resnet18", runs, grad_error=5e-3
    )
    close = with_float64(
        measurements("resnet18", w0["resnet18"], scale=8e-3, runs=runs), "resnet18", runs, 0
    )
    wrong = with_float64(
        measurements("resnet18", w0["resnet18"], scale=0.2, runs=runs), "resnet18", runs, 0
    )
    rows = equivalence.compare({"torch": (torch, {}), "jax": (close, {}), "mxnet": (wrong, {})}, w0)
    (grad,) = by(rows, backend="jax", check="gradients")
    # the larger float32 error sets it: jax's own (8e-3 from its float64 gradient) over torch's (5e-3)
    assert (
        grad.status == "ok"
        and abs(grad.tolerance - 3 * 8e-3) < 1e-9
        and "float32-vs-float64" in grad.note
    )
    assert by(rows, backend="mxnet", check="gradients")[0].status == "FAIL"
    # 0.2: not rounding
    assert by(rows, backend="mxnet", check="float32 vs float64")[0].status == "FAIL"
    # the float64 rows: the same math to 1e-10
    assert by(rows, backend="jax", check="math (float64)")[0].status == "ok"


def test_float64_row_fails_when_the_math_differs():
    w0 = {"lenet": weights.initial_weights("lenet", 0)}
    runs = (("ddp", 1, "local"),)
    torch = with_float64(measurements("lenet", w0["lenet"], runs=runs), "lenet", runs, 0)
    other = with_float64(
        measurements("lenet", w0["lenet"], runs=runs), "lenet", runs, 0, math_error=1e-8
    )
    (row,) = by(
        equivalence.compare({"torch": (torch, {}), "jax": (other, {})}, w0), check="math (float64)"
    )
    assert row.status == "FAIL" and abs(row.value - 1e-8) < 1e-12


def test_a_chaotic_float32_trace_is_measured_not_judged():
    w0 = {"resnet18": weights.initial_weights("resnet18", 0)}
    runs = (("ddp", 1, "local"),)
    torch = with_float64(
        measurements("resnet18", w0["resnet18"], runs=runs), "resnet18", runs, 0, trace_error=0.5
    )
    other = with_float64(
        measurements("resnet18", w0["resnet18"], scale=0.3, runs=runs), "resnet18", runs, 0
    )
    rows = equivalence.compare({"torch": (torch, {}), "jax": (other, {})}, w0)
    (trace,) = by(rows, backend="jax", check="3-step loss")
    assert trace.status == "measured" and "chaotic" in trace.note and abs(trace.value - 0.3) < 1e-9


def test_k_vs_1_is_judged_against_the_float32_rounding_of_both_runs():
    """--bn sync: the 2-device float32 step rounds further from its float64 math (2e-3) than the 1-device one (0):
    a k-vs-1 difference of 2e-3 is that rounding. Where the 2-device float32 run is itself exact, the same
    difference is other math and fails the fixed 1e-5."""
    w0 = {"resnet18": weights.initial_weights("resnet18", 0)}
    runs = (("ddp", 1, "sync"), ("ddp", 2, "sync"))

    def planted(rounding: bool) -> dict:
        arrays = with_float64(
            measurements("resnet18", w0["resnet18"], runs=runs), "resnet18", runs, 0
        )
        for name in equivalence._trainable("resnet18"):
            exact = arrays[f"resnet18|ddp|1|sync|first|{name}"]
            arrays[f"resnet18|ddp|2|sync|first|{name}"] = exact + 2e-3
            arrays[f"resnet18|float64|2|sync|first|{name}"] = exact if rounding else exact + 2e-3
        return arrays

    (row,) = by(
        equivalence.compare({"torch": (planted(rounding=True), {})}, w0), check="k vs 1 device"
    )
    assert row.status == "ok" and abs(row.value - 2e-3) < 1e-9 and abs(row.tolerance - 6e-3) < 1e-9
    (row,) = by(
        equivalence.compare({"torch": (planted(rounding=False), {})}, w0), check="k vs 1 device"
    )
    assert row.status == "FAIL" and row.tolerance == equivalence.TOLERANCE["k-vs-1"]


# ------------------------------------------------------------- injected differences must fail


def resnet_pair(runs, jax_grad_error=0.0, jax_state_scale=0.0):
    """torch and a backend on ResNet-18 with a realistic float32 floor (torch's float32 gradient 5e-3 from
    float64); the backend's gradients off by `jax_grad_error`, its running variances by `jax_state_scale`,
    in float32 and float64 alike (a difference in the math shows in both)."""
    w0 = {"resnet18": weights.initial_weights("resnet18", 0)}
    torch = with_float64(
        measurements("resnet18", w0["resnet18"], runs=runs), "resnet18", runs, grad_error=5e-3
    )
    torch.update(as_float64_runs(measurements("resnet18", w0["resnet18"], runs=runs)))
    other = measurements("resnet18", w0["resnet18"], runs=runs, state_scale=jax_state_scale)
    for key in [k for k in other if "|grad|" in k]:
        other[key] = other[key] * (1 + jax_grad_error)
    other = with_float64(other, "resnet18", runs, 0, math_error=jax_grad_error)
    other.update(as_float64_runs(other))
    return equivalence.compare({"torch": (torch, {}), "jax": (other, {})}, w0)


def test_an_injected_gradient_difference_of_1e_3_fails():
    """float32 cannot see 1e-3 on ResNet-18 (its own rounding is larger), float64 can, and says FAIL."""
    runs = (("ddp", 1, "local"), ("ddp", 2, "local"))
    rows = resnet_pair(runs, jax_grad_error=1e-3)
    # within 3x 5e-3
    assert all(r.status == "ok" for r in by(rows, backend="jax", check="gradients"))
    same = by(rows, backend="jax", check="same math (float64)")
    assert len(same) == 2 and all(
        r.status == "FAIL" and abs(r.value - 1e-3) < 1e-9 for r in same
    ), same
    assert all("nearest its tolerance: gradients" in r.note for r in same)
    assert by(rows, backend="jax", check="math (float64)")[0].status == "FAIL"
    # and without the injected difference, every one of those rows is ok
    clean = resnet_pair(runs)
    assert all(
        r.status == "ok"
        for r in clean
        if r.check in ("same math (float64)", "math (float64)", "gradients")
    )


def test_an_injected_batchnorm_convention_difference_fails():
    """Running variances updated with n/(n-1) of another size (1/127: a 2x2 map of 32 images) fail the
    float32 state row and the float64 row, while the parameters agree."""
    runs = (("ddp", 1, "local"),)
    rows = resnet_pair(runs, jax_state_scale=1 / 127)
    (state,) = by(rows, backend="jax", check="BatchNorm state, one step")
    assert state.status == "FAIL" and state.value > 1e-4
    (same,) = by(rows, backend="jax", check="same math (float64)")
    assert same.status == "FAIL" and "nearest its tolerance: state" in same.note
    assert by(rows, backend="jax", check="gradients")[0].status == "ok"
    clean = resnet_pair(runs)
    assert by(clean, backend="jax", check="BatchNorm state, one step")[0].status == "ok"
    assert by(clean, backend="jax", check="same math (float64)")[0].status == "ok"


# ------------------------------------------------------------- the float64 rows' measured floor


def with_float64_floor(arrays: dict, model: str, runs, rounding: dict[str, float]) -> dict:
    """Add the reference's float64 floor runs (common/measurements.py's FLOOR_RUNS) of each configuration: the
    permuted run `rounding[part]` (relative) from the in-order one in that part ("grad", "loss")."""
    out = dict(arrays)
    for strategy, k, bn in runs:
        key = f"{model}|{strategy}|{k}|{bn}"
        for name, scale in ((measurements_lib.IN_ORDER, {}), (measurements_lib.PERMUTED, rounding)):
            for stored in [s for s in arrays if s.startswith(f"{key}|")]:
                part = stored.split("|")[4]
                out[f"{model}|{name}|{k}|{bn}|{stored.split('|', 4)[4]}"] = arrays[stored] * (
                    1 + scale.get(part, 0.0)
                )
    return out


def float64_pair(
    gap: dict[str, float], rounding: dict[str, float] | None, runs=(("ddp", 2, "local"),)
):
    """torch and jax on LeNet: jax's float64 runs `gap[part]` (relative) from torch's; torch's float64 floor
    measured as `rounding` (None: not measured)."""
    w0 = {"lenet": weights.initial_weights("lenet", 0)}
    torch = measurements("lenet", w0["lenet"], runs=runs)
    torch.update(as_float64_runs(torch))
    if rounding is not None:
        torch = with_float64_floor(torch, "lenet", runs, rounding)
    other = measurements("lenet", w0["lenet"], runs=runs)
    float64 = as_float64_runs(other)
    for key in float64:
        float64[key] = float64[key] * (1 + gap.get(key.split("|")[4], 0.0))
    other.update(float64)
    return equivalence.compare({"torch": (torch, {}), "jax": (other, {})}, w0)


def same_math_row(gap, rounding):
    (row,) = by(float64_pair(gap, rounding), backend="jax", check="same math (float64)")
    return row


FACTOR = equivalence.FLOAT64_FACTOR


def test_a_float64_row_allows_the_factor_times_its_measured_floor():
    """torch's float64 gradients move by 5e-10 when its shards are summed in another order: a gap of 0.6x the
    factor times that floor passes, and the row says where its tolerance comes from."""
    row = same_math_row({"grad": 0.6 * FACTOR * 5e-10}, {"grad": 5e-10})
    assert row.status == "ok" and row.value == pytest.approx(0.6 * FACTOR * 5e-10, rel=1e-6)
    assert row.tolerance == pytest.approx(FACTOR * 5e-10)
    assert (
        f"nearest its tolerance: gradients; tolerance {FACTOR}x float64 floor 5.0e-10" in row.note
    )


def test_a_float64_gap_beyond_the_factor_times_its_floor_fails():
    assert same_math_row({"grad": 1.2 * FACTOR * 5e-10}, {"grad": 5e-10}).status == "FAIL"
    far = same_math_row({"grad": 1e-6}, {"grad": 5e-10})
    assert far.status == "FAIL" and far.value == pytest.approx(1e-6, rel=1e-6)


def test_one_quantitys_floor_does_not_widen_another():
    """A rounding of 5e-10 in the gradients allows nothing more in the loss: a loss 3e-9 off fails at 1e-10."""
    row = same_math_row({"loss": 3e-9}, {"grad": 5e-10})
    assert row.status == "FAIL" and row.tolerance == equivalence.TOLERANCE["same math"]
    assert (
        f"nearest its tolerance: loss; tolerance 1e-10, above {FACTOR}x float64 floor 0.0e+00"
        in (row.note)
    )


def test_a_float64_tolerance_is_never_below_1e_10():
    row = same_math_row({"grad": 5e-11}, {"grad": 1e-13})
    assert row.status == "ok" and row.tolerance == 1e-10
    assert f"tolerance 1e-10, above {FACTOR}x float64 floor 1.0e-13" in row.note
    assert same_math_row({"grad": 3e-10}, {"grad": 1e-13}).status == "FAIL"


def test_without_a_measured_floor_a_float64_row_keeps_1e_10_and_says_so():
    row = same_math_row({"grad": 3e-9}, None)
    assert row.status == "FAIL" and row.tolerance == 1e-10
    assert row.note.endswith("tolerance 1e-10: no float64 floor measured")


def test_the_floor_runs_are_not_runs_of_a_strategy():
    rows = float64_pair({}, {"grad": 5e-10})
    assert {r.strategy for r in rows if r.check == "same math (float64)"} == {"ddp"}
    assert not [r for r in rows if "float64-" in r.strategy]


def test_the_one_device_float64_row_allows_the_factor_times_the_one_device_floor():
    w0 = {"lenet": weights.initial_weights("lenet", 0)}
    runs = (("ddp", 1, "local"),)
    torch = with_float64(measurements("lenet", w0["lenet"], runs=runs), "lenet", runs, 0)
    torch = with_float64_floor(torch, "lenet", runs, {"grad": 4e-10})

    def math_row(error):
        other = with_float64(
            measurements("lenet", w0["lenet"], runs=runs), "lenet", runs, 0, math_error=error
        )
        compared = equivalence.compare({"torch": (torch, {}), "jax": (other, {})}, w0)
        return by(compared, backend="jax", check="math (float64)")[0]

    row = math_row(2e-9)  # loss and gradients 2e-9 off: the loss has no floor above 1e-10
    assert row.status == "FAIL" and "nearest its tolerance: loss" in row.note
    torch = with_float64_floor(torch, "lenet", runs, {"grad": 4e-10, "loss": 5e-10})
    row = math_row(2e-9)
    assert row.status == "ok" and row.tolerance == pytest.approx(FACTOR * 4e-10)
    assert row.note.endswith(
        f"nearest its tolerance: gradients; tolerance {FACTOR}x float64 floor 4.0e-10"
    )
    assert math_row(1e-7).status == "FAIL"


def test_the_nodes_float64_row_allows_the_factor_times_the_references_floor():
    w0 = {"lenet": weights.initial_weights("lenet", 0)}
    runs = (("ddp", 2, "local"),)
    single = measurements("lenet", w0["lenet"], runs=runs)
    single.update(as_float64_runs(single))
    multi = dict(single)
    for key in [k for k in multi if k.startswith("lenet|ddp:float64|2|local|grad|")]:
        multi[key] = multi[key] * (1 + 3e-9)
    reference = with_float64_floor(single, "lenet", runs, {"grad": 5e-10})

    def nodes_row(reference):
        rows = equivalence.compare_nodes("torch", single, (multi, {}), 2, w0, reference)
        return by(rows, check="nodes vs 1 process (float64)")[0]

    row = nodes_row(reference)
    assert row.status == "ok" and row.tolerance == pytest.approx(FACTOR * 5e-10)
    assert f"tolerance {FACTOR}x float64 floor 5.0e-10" in row.note
    assert nodes_row(None).status == "FAIL" and "no float64 floor measured" in nodes_row(None).note


def test_the_permuted_floor_run_sums_every_shard_in_another_order():
    """Each device keeps its own images (the same statistics in exact arithmetic), labels with their images,
    and every image moves within its shard."""
    x = np.arange(8, dtype=np.float64).reshape(8, 1) * 10
    y = np.arange(8)
    ((px, py),) = measurements_lib.permuted_within_shards([(x, y)], 2)
    assert py.tolist() == [3, 0, 1, 2, 7, 4, 5, 6]
    assert np.array_equal(px[:, 0], py * 10)


# ------------------------------------------------------------- the references are always measured


class RecordingBackend:
    """A check worker's backend that records what it is asked for and returns fixed numbers."""

    def __init__(self, model: str):
        self.model, self.calls, self.reference_labels = model, [], []
        self.w = weights.initial_weights(model, 0)

    def predict(self, model, w, x, train=False, dtype="float32"):
        return np.zeros((len(x), 10), dtype)

    def float64_gradients(self, model, w, x, y):
        return 2.3, {
            n: np.zeros(s)
            for n, s, kind in architectures.spec(model)
            if kind not in ("bn_mean", "bn_var")
        }

    name = "torch"

    def check_supported(self, cfg, dtype="float32"):
        pass

    def run_probes(self, probe, w, runs, lr):
        return [
            self.gradients(dataclasses.replace(probe, dtype=dtype), w, *batches[0])
            if name == "gradients"
            else self.train_trace(dataclasses.replace(probe, dtype=dtype), w, batches, lr)
            for name, dtype, batches in runs
        ]

    def gradients(self, probe, w, x, y):
        self.calls.append(("gradients", probe.strategy, probe.devices, probe.dtype, 1))
        return self.float64_gradients(probe.model, w, x, y)

    def train_trace(self, probe, w, batches, lr):
        self.calls.append(("trace", probe.strategy, probe.devices, probe.dtype, len(batches)))
        return {"first": self.w, "final": self.w, "losses": [2.3] * len(batches)}

    def float64_reference(self, model, k, w, batches, lr, bn="local", device_kind="cpu"):
        self.calls.append(("reference", bn, k, device_kind, len(batches)))
        self.reference_labels.append([y.tolist() for _, y in batches])
        loss, grads = self.float64_gradients(model, w, None, None)
        return loss, grads, self.train_trace(Probe("-", model, k, dtype="float64"), w, batches, lr)


def test_the_check_worker_measures_float64_runs_and_whole_reference_traces(tmp_path):
    """Each strategy runs in float32 (whole trace) and float64 (FLOAT64_STEPS); the reference's float64
    trace is whole for every device count and BatchNorm mode, so each configuration has its own float32
    floor, and the reference runs FLOAT64_STEPS again as the batches come and with every shard permuted:
    the float64 floor, on the devices the strategies ran on."""
    from common import measurements as worker

    backend = RecordingBackend("lenet")
    labels = np.arange(24, dtype=np.int32).reshape(6, 4)
    np.savez(tmp_path / "b.npz", x=np.zeros((6, 4, 1, 28, 28), np.float32), y=labels)
    weights.save(tmp_path / "w.npz", backend.w)
    job = checkjob.CheckJob(
        models=("lenet",),
        strategies=("ddp",),
        devices=(1, 2),
        bn=("local",),
        lr=0.1,
        device_kind="gpu",
        float64=True,
        batches=str(tmp_path / "b.npz"),
        weights={"lenet": str(tmp_path / "w.npz")},
    )
    out, skipped = worker.measure(backend, job)
    traces = [c for c in backend.calls if c[0] == "trace" and c[1] == "ddp"]
    assert sorted(traces) == sorted(
        [
            ("trace", "ddp", k, dtype, n)
            for k in (1, 2)
            for dtype, n in (("float32", 6), ("float64", worker.FLOAT64_STEPS))
        ]
    )
    steps = worker.FLOAT64_STEPS
    assert [c for c in backend.calls if c[0] == "reference"] == [
        ("reference", "local", k, kind, n)
        for k in (1, 2)
        for kind, n in (("cpu", 6), ("gpu", steps), ("gpu", steps))
    ]
    in_order = labels[:steps].tolist()
    assert backend.reference_labels[1] == backend.reference_labels[4] == in_order
    assert backend.reference_labels[2] == [[3, 0, 1, 2], [7, 4, 5, 6], [11, 8, 9, 10]]  # 1 device
    assert backend.reference_labels[5] == [[1, 0, 3, 2], [5, 4, 7, 6], [9, 8, 11, 10]]  # 2 devices
    assert "lenet|ddp:float64|2|local|final|fc2.bias" in out and not skipped
    assert "lenet|float64-permuted|2|local|final|fc2.bias" in out
    assert "lenet|float64-in-order|1|local|loss" in out
    # the reference's logits in float64 too
    assert out["lenet|float64|forward|eval"].dtype == np.float64


class FreshArraysBackend(RecordingBackend):
    """A RecordingBackend whose traces give fresh arrays after each step, as a trainer's canonical() does."""

    def train_trace(self, probe, w, batches, lr):
        trace = super().train_trace(probe, w, batches, lr)
        fresh = {n: v.copy() for n, v in self.w.items()}
        return {**trace, "first": fresh, "final": {n: v.copy() for n, v in self.w.items()}}


def cpu_job(tmp_path, backend, steps: int) -> checkjob.CheckJob:
    """The reference's job on the CPU over `steps` batches (LeNet, 1 and 2 devices), its files written."""
    labels = np.arange(4 * steps, dtype=np.int32).reshape(steps, 4)
    np.savez(tmp_path / "b.npz", x=np.zeros((steps, 4, 1, 28, 28), np.float32), y=labels)
    weights.save(tmp_path / "w.npz", backend.w)
    return checkjob.CheckJob(
        models=("lenet",),
        strategies=("ddp",),
        devices=(1, 2),
        bn=("local",),
        lr=0.1,
        device_kind="cpu",
        float64=True,
        batches=str(tmp_path / "b.npz"),
        weights={"lenet": str(tmp_path / "w.npz")},
    )


def test_what_the_check_worker_has_measured_once_it_neither_measures_nor_stores_again(tmp_path):
    """On the CPU over at most FLOAT64_STEPS steps, the reference's in-order floor run is its whole-trace run's
    own call, and that run's first gradients on 1 device are the float64 gradients of the model: each is those
    arrays, not another run. A one-step trace's last weights are its first. The file stores each array once and
    reads back every name with its values."""
    from common import measurements as worker
    from common.measurement_files import MeasurementFile

    backend = FreshArraysBackend("lenet")
    job = cpu_job(tmp_path, backend, 2)
    out, _ = worker.measure(backend, job)
    assert [c for c in backend.calls if c[0] == "reference"] == [
        ("reference", "local", k, "cpu", 2) for k in (1, 1, 2, 2)
    ]  # the whole trace and the permuted one: no in-order run
    assert backend.reference_labels[1] == [[3, 0, 1, 2], [7, 4, 5, 6]]
    for k in (1, 2):
        whole = f"lenet|float64|{k}|local|"
        parts = [key[len(whole) :] for key in out if key.startswith(whole)]
        assert "loss" in parts and "final|fc2.bias" in parts
        assert all(out[f"lenet|float64-in-order|{k}|local|{p}"] is out[whole + p] for p in parts)
    grads = [n for n, _, kind in architectures.spec("lenet")]
    assert out["lenet|float64|loss"] is out["lenet|float64|1|local|loss"]
    assert all(
        out[f"lenet|float64|grad|{n}"] is out[f"lenet|float64|1|local|grad|{n}"] for n in grads
    )
    # two steps: the last weights are their own arrays
    assert out["lenet|ddp|1|local|final|fc2.bias"] is not out["lenet|ddp|1|local|first|fc2.bias"]

    backend = FreshArraysBackend("lenet")
    job = cpu_job(tmp_path, backend, 1)
    job_path, path = tmp_path / "job.json", tmp_path / "torch.npz"
    job_path.write_text(job.to_json())
    worker.run(backend, str(job_path), str(path))
    out, _ = worker.measure(backend, job)
    finals = [k for k in out if "|final|" in k]
    assert finals and all(out[k] is out[k.replace("|final|", "|first|")] for k in finals)
    with np.load(path) as stored:
        assert len(stored.files) == len({id(v) for v in out.values()}) + 1  # (and the aliases)
    with MeasurementFile(path) as read:
        assert sorted(read) == sorted(out)
        assert all(read[k].dtype == np.asarray(v).dtype for k, v in out.items())
        assert all(np.array_equal(read[k], v) for k, v in out.items())
        assert "aliases" not in read and read.get("lenet|ddp|1|local|final|nothing") is None


def test_a_measurement_file_reads_what_np_savez_wrote(tmp_path):
    """Every array of a .npz written by numpy, stored or compressed, as np.load reads it: 0-d, empty,
    Fortran-ordered, big-endian."""
    from common.measurement_files import MeasurementFile

    arrays = {
        "a|loss": np.float64(2.5),
        "a|grad|w": np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
        "a|losses": np.zeros(0),
        "a|first|w": np.arange(3, dtype=">f8"),
    }
    for save in (np.savez, np.savez_compressed):
        save(tmp_path / "m.npz", **arrays)
        with MeasurementFile(tmp_path / "m.npz") as read:
            assert list(read) == list(arrays)
            for k, v in arrays.items():
                assert read[k].dtype == v.dtype and read[k].shape == v.shape
                assert np.array_equal(read[k], v)


def damaged_measurements(path: Path, kind: str) -> None:
    """A measurement file damaged in one way (common/measurement_files.py writes it: save())."""
    from common.measurement_files import save

    # (the gradient larger than zipfile's read-ahead, which checks a small entry's CRC-32 itself)
    arrays = {"lenet|ddp|1|local|loss": np.float64(2.3), "lenet|ddp|1|local|grad|w": np.ones(10**5)}
    if kind in ("truncated", "bit-flipped"):
        save(path, arrays)
        raw = bytearray(path.read_bytes())
        if kind == "truncated":
            raw = raw[: len(raw) // 2]
        else:
            raw[raw.index(np.ones(16).tobytes()) + 3] ^= 0x10
        path.write_bytes(bytes(raw))
    elif kind == "alias of nothing":
        np.savez(
            path, aliases=np.array([["lenet|ddp|1|local|final|w", "lenet|ddp|1|local|first|w"]])
        )
    elif kind == "aliases not pairs":
        np.savez(path, aliases=np.zeros(3), **arrays)
    elif kind == "shorter than its shape":
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            header, {"descr": "<f8", "fortran_order": False, "shape": (10,)}
        )
        with zipfile.ZipFile(path, "w") as f:
            f.writestr("lenet|ddp|1|local|loss.npy", header.getvalue() + np.ones(1).tobytes())
    elif kind == "objects":
        np.savez(path, x=np.array([1, None], dtype=object))
    elif kind == "npy":
        with open(path, "wb") as f:
            np.save(f, np.ones(3))
    else:
        path.write_bytes(b"")


@pytest.mark.parametrize(
    "kind,reason",
    [
        ("truncated", "File is not a zip file"),
        ("bit-flipped", "Bad CRC-32 for file 'lenet|ddp|1|local|grad|w.npy'"),
        (
            "alias of nothing",
            "'lenet|ddp|1|local|final|w' is stored as 'lenet|ddp|1|local|first|w'",
        ),
        ("aliases not pairs", "aliases is not a list of"),
        ("shorter than its shape", "its data is not the size of its shape"),
        ("objects", "an array of Python objects"),
        ("npy", "File is not a zip file"),
        ("empty", "File is not a zip file"),
    ],
)
def test_a_damaged_measurement_file_is_unreadable_in_one_line(tmp_path, kind, reason):
    out = tmp_path / "torch.npz"
    damaged_measurements(out, kind)
    Path(str(out) + ".skipped.json").write_text("{}")
    with pytest.raises(workers.CheckError) as e:
        workers.worker_output(out)
    assert str(e.value).startswith("unreadable measurements in torch.npz: ")
    assert reason in str(e.value) and len(str(e.value).splitlines()) == 1


def test_a_request_without_one_device_still_measures_the_one_device_references(monkeypatch):
    """`--gpus 2` alone: every backend's job still runs 1 device (the floor and own-float32 references),
    and the table shows the 2-device rows asked for, not the 1-device ones measured as references."""
    from common import manifest

    jobs = {}
    w0 = weights.initial_weights("lenet", 0)

    def fake_measure(worker, job):
        jobs[worker.name] = job
        runs = [(s, k, "local") for s in job.strategies for k in job.devices]
        arrays = with_float64(measurements("lenet", w0, runs=runs), "lenet", runs, 0)
        return equivalence.Measurements({**arrays, **as_float64_runs(arrays)}, {})

    monkeypatch.setattr(workers, "measure", fake_measure)
    backends = {"torch": manifest.load("torch"), "jax": manifest.load("jax")}
    request = workers.CheckRequest(
        models=["lenet"],
        strategies={"torch": ["ddp"], "jax": ["pmap"]},
        counts=[2],
        bn_modes=["local"],
        steps=3,
        batch_size=4,
        lr=0.1,
        seed=0,
        dataset=check_dataset(),
        device_kind="cpu",
        timeout=60,
        pythons={"torch": "python", "jax": "python"},
    )
    rows, failures, _ = workers.run_checks(backends, request, say=lambda m: None)
    assert jobs["torch"].devices == (1, 2) and jobs["jax"].devices == (1, 2) and not failures
    shown = {(r.check, r.devices) for r in rows}
    assert ("float32 vs float64", "1") in shown and ("k vs 1 device", "2") in shown
    assert not [
        r
        for r in rows
        if r.devices == "1" and r.check in ("loss", "gradients", "same math (float64)")
    ]
    failed = [r for r in rows if r.status == "FAIL"]
    assert [(r.check, r.backend) for r in failed] == [
        ("k vs 1 device", "torch"),
        ("k vs 1 device", "jax"),
    ]  # (planted)


def check_dataset():
    from common import data

    return data.synthetic(12, 10, 0)


# ------------------------------------------------------------- the check job and the measurement keys

ROOT = Path(__file__).resolve().parents[2]


def small_job(tmp_path, **changes) -> checkjob.CheckJob:
    """A job of torch's ddp on LeNet (its files need not exist: nothing here reads them)."""
    job = checkjob.CheckJob(
        models=("lenet",),
        strategies=("ddp",),
        devices=(1, 2),
        bn=("local", "sync"),
        lr=0.1,
        device_kind="cpu",
        float64=True,
        weights={"lenet": str(tmp_path / "w.npz")},
        batches=str(tmp_path / "b.npz"),
    )
    return replace(job, **changes)


def test_a_measurement_key_round_trips_through_its_string():
    key = checkjob.MeasurementKey("resnet18", "ddp", 2, "sync")
    assert key.to_str() == "resnet18|ddp|2|sync"
    assert checkjob.MeasurementKey.parse("resnet18|ddp|2|sync") == key
    assert key.part("grad", "fc.weight") == "resnet18|ddp|2|sync|grad|fc.weight"
    assert key.float64().to_str() == "resnet18|ddp:float64|2|sync"
    assert checkjob.MeasurementKey.parse(key.float64().to_str()) == key.float64()
    assert key.is_strategy_run and not key.float64().is_strategy_run
    assert not key.run_of(checkjob.IN_ORDER).is_strategy_run


@pytest.mark.parametrize(
    "text",
    ["lenet|ddp|2", "lenet|ddp|two|local", "lenet|ddp|0|local", "lenet||2|local", "a|b|1|c|loss"],
)
def test_a_malformed_measurement_key_is_refused_in_one_line(text):
    with pytest.raises(ValueError) as e:
        checkjob.MeasurementKey.parse(text)
    assert len(str(e.value).splitlines()) == 1


def test_a_check_job_round_trips_through_its_json_file(tmp_path):
    job = small_job(tmp_path, nodes=2, node_rank=1, coordinator="127.0.0.1:29500")
    path = tmp_path / "job.json"
    path.write_text(job.to_json())
    assert checkjob.CheckJob.load(path) == job
    assert json.loads(path.read_text())["devices"] == [1, 2]
    assert [k.to_str() for k in job.keys("lenet")] == ["lenet|ddp|1|local", "lenet|ddp|2|local"]


MISSING = object()


@pytest.mark.parametrize(
    "field,value,reason",
    [
        ("lr", MISSING, "missing field 'lr'"),
        ("lr", "0.1", "'lr' must be a positive number, not '0.1'"),
        (
            "devices",
            [1, 0],
            "'devices' must be a list of device counts (whole numbers from 1), not [1, 0]",
        ),
        ("bn", ["global"], "'bn' must be a list of BatchNorm modes (local, sync), not ['global']"),
        ("float64", "yes", "'float64' must be true or false, not 'yes'"),
        ("weights", {}, "no weights file for model 'lenet'"),
        ("nodes", 2, "2 nodes need a 'coordinator'"),
        ("node_rank", 1, "'node_rank' 1 is not one of 1 nodes"),
        ("weights_hash", {}, "unknown field 'weights_hash'"),
    ],
)
def test_a_malformed_check_job_is_refused_in_one_line(tmp_path, field, value, reason):
    data = json.loads(small_job(tmp_path).to_json())
    if value is MISSING:
        del data[field]
    else:
        data[field] = value
    path = tmp_path / "job.json"
    path.write_text(json.dumps(data))
    with pytest.raises(checkjob.JobError) as e:
        checkjob.CheckJob.load(path)
    assert str(e.value) == f"check job {path}: {reason}"


def test_a_check_job_that_is_no_json_object_is_refused_in_one_line(tmp_path):
    path = tmp_path / "job.json"
    path.write_text('{"models": ["lenet"],')
    with pytest.raises(checkjob.JobError, match=r"^check job .*job\.json: not JSON: ") as e:
        checkjob.CheckJob.load(path)
    assert len(str(e.value).splitlines()) == 1
    path.write_text("[1, 2]")
    with pytest.raises(checkjob.JobError) as e:
        checkjob.CheckJob.load(path)
    assert str(e.value) == f"check job {path}: a check job is a JSON object, not list"


def test_the_check_worker_ends_on_a_malformed_job_with_its_reason_and_no_traceback(tmp_path):
    """The harness shows a failed worker's last line: it must be the reason, not a traceback's."""
    data = json.loads(small_job(tmp_path).to_json())
    del data["device_kind"]
    path, out = tmp_path / "job.json", tmp_path / "out.npz"
    path.write_text(json.dumps(data))
    worker = f"from common import measurements; measurements.run(None, {str(path)!r}, {str(out)!r})"
    ended = subprocess.run(
        [sys.executable, "-c", worker],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert ended.returncode == 1 and not out.exists()
    assert ended.stderr == f"check job {path}: missing field 'device_kind'\n"


def test_a_skipped_list_with_a_malformed_key_is_unreadable(tmp_path):
    out = tmp_path / "torch.npz"
    np.savez(out, x=np.zeros(1))
    Path(str(out) + ".skipped.json").write_text(json.dumps({"lenet|ddp|local": "no"}))
    with pytest.raises(
        workers.CheckError, match="unreadable torch.npz.skipped.json: not a measurement key"
    ):
        workers.worker_output(out)


# ------------------------------------------------------------- the check worker's process


def test_a_check_worker_is_launched_as_a_run_is(tmp_path):
    """runner.launch: its output logged, a timeout kills its whole group, its last line says why it failed."""
    marker = "3117.5"
    hanging = fake_python(
        tmp_path, f"echo 'loading'\nsleep {marker} &\nsleep {marker}", name="hanging"
    )
    job = small_job(tmp_path)
    with pytest.raises(workers.CheckError, match="torch: no answer within 1 s"):
        workers.measure(workers.Worker("torch", hanging, tmp_path, 1, tmp_path / "logs"), job)
    assert "loading" in (tmp_path / "logs" / "check-torch.log").read_text()
    assert processes_with(f"sleep {marker}") == []
    failing = fake_python(tmp_path, "echo 'bad job' >&2; exit 3", name="failing")
    with pytest.raises(workers.CheckError, match="jax worker failed: bad job"):
        workers.measure(workers.Worker("jax", failing, tmp_path, 30, tmp_path), job)
    assert (tmp_path / "check-jax.log").read_text().endswith("bad job\n")


@pytest.mark.parametrize(
    "backend,expected",
    [("jax", {"torch": ["ddp"], "jax": ["pmap", "sharding"]}), ("torch", {"torch": ["scratch"]})],
)
def test_a_report_without_torch_measures_torch_as_its_reference(monkeypatch, backend, expected):
    """A run's equivalence section compares every backend with torch: a report of jax alone must measure torch
    too (its ddp), or its check measures jax for nothing and shows no row."""
    from harness.cli import build_plan, parse

    strategy = ["--strategy", "scratch"] if backend == "torch" else []
    plan = build_plan(
        parse(
            [
                "--backend",
                backend,
                *strategy,
                "--device",
                "cpu",
                "--gpus",
                "1",
                "--dataset",
                "synthetic",
            ]
        )
    )
    asked = {}

    def run_checks(backends, request, **kw):
        asked.update(backends=sorted(backends), strategies=request.strategies)
        return [], {}, {}

    monkeypatch.setattr(workers, "run_checks", run_checks)
    workers.equivalence(plan, lambda line: None)
    assert asked["strategies"] == expected and asked["backends"] == sorted(expected)
