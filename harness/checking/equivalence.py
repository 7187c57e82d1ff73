"""The equivalence table's comparisons: measurements of every backend (common/measurements.py, run by
harness/checking/workers.py) against torch's, each with its tolerance, as table rows. Pure numpy, no process."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from common import manifest
from common.architectures import spec
from common.checkjob import (
    BN_MODES,
    FLOAT64_RUN,
    FORWARD_MODES,
    IN_ORDER,
    PERMUTED,
    SEPARATOR,
    MeasurementKey,
    float64_key,
    forward_key,
)
from harness.reporting import tables
from harness.reporting.tables import fmt

# What "the same" means, per comparison (stated in the table and the report).
TOLERANCE = {
    "forward": 1e-4,  # max |logits - torch logits|
    "loss": 1e-4,  # |loss - torch loss| / |torch loss|
    "gradients": 1e-4,  # ||g - g_torch|| / ||g_torch||, over all trainable parameters
    "step": 1e-3,  # ||w1 - w1_torch|| / ||w1_torch - w0||: the first SGD updates agree
    "trace": 1e-3,  # max over the steps of |loss - torch loss|
    "k-vs-1": 1e-5,  # max |w1(k devices) - w1(1 device)| (LeNet; ResNet-18 with --bn sync)
    "float64": 1e-10,  # least tolerance of the float64 rows (FLOAT64_FACTOR below): loss and gradients in float64
    "float32": 1e-1,  # a backend's own float32 gradient vs its float64 one: beyond this it is not rounding
    "state": 1e-4,  # ||s - s_torch|| / ||s_torch||: BatchNorm running mean and variance after the step(s)
    "same math": 1e-10,  # the same, of a strategy's float64 run vs torch's: loss, gradients, weights, state, losses
}
# Where float32 itself cannot reach those (ResNet-18's gradients on small batches: each framework's own
# float32 gradient is ~1e-3..3e-2 from its float64 one, depending on the batch), a row's tolerance is
# FLOOR_FACTOR x the larger of the two float32-vs-float64 distances (torch's and the backend's, the latter
# only if within TOLERANCE["float32"]): by the triangle inequality two implementations of the same math
# are then within 2x of it. The float64 rows show that the math itself is the same.
FLOOR_FACTOR = 3
# A float64 row allows FLOAT64_FACTOR x the float64 floor of each quantity it compares (never less than its
# TOLERANCE): the distance of torch's float64 run from itself with every shard's images permuted
# (common/measurements.py). That floor samples the rounding of the batch sums only; another framework also rounds
# its convolutions in its own order, and a trajectory amplifies both. Measured on ResNet-50 (docs/equivalence.md):
# every framework's float64 run is 0.4x to 2x the floor where the floor sets the tolerance, and at most 12x where
# it is far below 1e-10; 30 covers both with room. Different math (a BatchNorm or momentum convention) is 1e-8
# and more in a quantity whose floor is 1e-14 or less, so the factor hides none of it.
FLOAT64_FACTOR = 30


@dataclass(kw_only=True)
class CheckRow:
    """One row of the equivalence table, built by name; its fields are results.json's equivalence rows."""

    check: str
    model: str
    backend: str
    strategy: str
    devices: str
    bn: str
    value: float | None
    tolerance: float | None
    status: str  # ok, FAIL, measured (a documented difference), not run
    note: str = ""


class Measurements(NamedTuple):
    """What one backend's check worker wrote (common/measurements.py): its arrays (a dict, or an open .npz read
    as the comparisons ask) and the configurations it could not run, {key: why}."""

    arrays: Mapping[str, np.ndarray]
    skipped: dict[str, str]


@dataclass(frozen=True)
class Stored:
    """A backend's arrays under one key prefix: stored[name] is arrays["<prefix>|<name>"]."""

    arrays: Mapping[str, np.ndarray]
    prefix: str

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[self.prefix + SEPARATOR + name]


@dataclass(frozen=True)
class Run:
    """One configuration's measurements: a backend's arrays and the key its run is stored under. `"loss" in run`
    says whether it was measured; run["losses"] is one of its quantities."""

    arrays: Mapping[str, np.ndarray]
    key: MeasurementKey

    def __getitem__(self, part: str) -> np.ndarray:
        return self.arrays[self.key.part(part)]

    def __contains__(self, part: str) -> bool:
        return self.key.part(part) in self.arrays

    def stored(self, part: str) -> Stored:
        """Its parameters of one part ("grad", "first", "final"), by name."""
        return Stored(self.arrays, self.key.part(part))

    def of(self, key: MeasurementKey) -> Run:
        """Another run in the same arrays (its float64 run, its 1-device run)."""
        return Run(self.arrays, key)

    def float64(self) -> Run:
        return self.of(self.key.float64())


@dataclass(frozen=True)
class Pair:
    """A backend's run of one configuration and the run it is compared with (torch's of the same model, devices
    and BatchNorm mode), both from the model's initial weights `w0`."""

    backend: str
    run: Run
    ref: Run
    w0: dict[str, np.ndarray]


@dataclass(frozen=True)
class Reference:
    """The reference backend's measurements, which every backend's are compared with, and each model's initial
    weights."""

    name: str
    arrays: Mapping[str, np.ndarray]
    runs: list[MeasurementKey]  # runs_of(arrays)
    w0: dict[str, dict[str, np.ndarray]]

    def run_like(self, key: MeasurementKey) -> Run | None:
        """The reference's run of the model, devices and BatchNorm mode of `key` (its first strategy's), or None
        where it measured none."""
        same = (key.model, key.devices, key.bn)
        found = [k for k in self.runs if (k.model, k.devices, k.bn) == same]
        return Run(self.arrays, found[0]) if found else None


def _about(backend: str, key: MeasurementKey) -> dict[str, str]:
    """A row's configuration, by name: the model, backend, strategy, devices and BatchNorm mode of `key`."""
    return {
        "model": key.model,
        "backend": backend,
        "strategy": key.strategy,
        "devices": str(key.devices),
        "bn": key.bn,
    }


def _trainable(model: str) -> list[str]:
    return [n for n, _, kind in spec(model) if kind not in ("bn_mean", "bn_var")]


def _statistics(model: str) -> list[str]:
    """BatchNorm running means and variances: state, not parameters, but part of the math (evaluation uses them)."""
    return [n for n, _, kind in spec(model) if kind in ("bn_mean", "bn_var")]


def _gap(a: Stored, b: Stored, names: list[str], start: dict | None = None):
    """(||a - b||, ||b||, ||b - start||, max |a - b|) over the parameters `names`, in float64. One parameter at a
    time, each read, compared and dropped: the check never holds a whole model's measurements (ResNet-50's are
    100 MB each in float32)."""
    diff2 = ref2 = moved2 = peak = 0.0
    for n in names:
        # (no more temporaries than needed: each is fresh memory, ResNet-50's largest 19 MB a parameter)
        x, y = np.ravel(a[n]), np.asarray(b[n], dtype=np.float64).ravel()
        d = np.subtract(x, y, dtype=np.float64)
        diff2, ref2 = diff2 + float(d @ d), ref2 + float(y @ y)
        peak = max(peak, float(d.max()), -float(d.min())) if d.size else peak
        if start is not None:
            m = np.subtract(y, np.ravel(start[n]), out=d, dtype=np.float64)
            moved2 += float(m @ m)
    return math.sqrt(diff2), math.sqrt(ref2), math.sqrt(moved2), peak


def _relative_gap(a: Stored, b: Stored, names: list[str]) -> float:
    """||a - b|| / ||b|| over the parameters `names` (||a - b|| where b is zero): _gap's measure of a row."""
    diff, norm, _, _ = _gap(a, b, names)
    return diff / norm if norm else diff


def _verdict(value: float, tolerance: float) -> str:
    return "ok" if value <= tolerance else "FAIL"


def runs_of(arrays: Mapping) -> list[MeasurementKey]:
    """Every measured configuration, sorted: the strategies' float32 runs (not their float64 runs, not the
    reference's own float64 runs)."""
    found = set()
    for stored in arrays:
        prefix, _, part = stored.rpartition(SEPARATOR)
        if part == "loss" and prefix.count(SEPARATOR) == 3:
            key = MeasurementKey.parse(prefix)
            if key.is_strategy_run:
                found.add(key)
    return sorted(found)


def _models(arrays: Mapping) -> list[str]:
    """The models whose forward pass a backend measured."""
    return sorted({k.split(SEPARATOR)[0] for k in arrays if f"{SEPARATOR}forward{SEPARATOR}" in k})


def compare(
    results: dict[str, Measurements], w0: dict[str, dict], reference: str | None = None
) -> list[CheckRow]:
    """Every backend's rows against `reference`'s measurements (default: the suite's reference backend),
    backend by backend: its forward and float64 rows per model, then each measured configuration's, then what it
    could not run."""
    reference = reference or manifest.reference()
    ref_arrays = results[reference][0]
    ref = Reference(reference, ref_arrays, runs_of(ref_arrays), w0)
    rows: list[CheckRow] = []
    for name, (arrays, skipped) in results.items():
        if name != reference:
            rows += _model_rows(ref, name, arrays)
        own_rows = set()
        for key in runs_of(arrays):
            run = Run(arrays, key)
            own = own_float32_error(arrays, key)
            if own is not None and (key.model, key.strategy) not in own_rows:
                own_rows.add((key.model, key.strategy))
                rows.append(_own_float32_row(name, key, own))
            rows += _run_rows(ref, name, run, own)
        for key, reason in skipped.items():
            about = _about(name, MeasurementKey.parse(key))
            rows.append(
                CheckRow(
                    check="all", **about, value=None, tolerance=None, status="not run", note=reason
                )
            )
    return rows


def _model_rows(ref: Reference, name: str, arrays: Mapping) -> list[CheckRow]:
    """A backend's 1-device rows of each model: its logits in both BatchNorm modes, and its float64 loss and
    gradients (where both backends measured them)."""
    rows = []
    for model in _models(arrays):
        for mode in FORWARD_MODES:
            rows.append(_forward_row(arrays, ref.arrays, model, mode, name))
        loss = float64_key(model, "loss")
        if loss in arrays and loss in ref.arrays:
            one = one_device_floor(ref.arrays, model, ref.w0[model])
            rows.append(_float64_row(arrays, ref.arrays, model, name, one))
    return rows


def _own_float32_row(name: str, key: MeasurementKey, own: float) -> CheckRow:
    return CheckRow(
        check="float32 vs float64",
        **{**_about(name, key), "devices": "1", "bn": "-"},
        value=own,
        tolerance=TOLERANCE["float32"],
        status=_verdict(own, TOLERANCE["float32"]),
        note="this backend's float32 gradient vs its float64 one",
    )


def _run_rows(ref: Reference, name: str, run: Run, own: float | None) -> list[CheckRow]:
    """One configuration's rows: against the reference's run of it (loss, gradients, one step, the trace,
    BatchNorm state, the same math in float64), then k devices against 1."""
    w0 = ref.w0[run.key.model]
    reference = ref.run_like(run.key)
    floor = float32_floor(reference, w0) if reference else None
    if floor is not None:
        floor = widened_floor(floor, run, w0, own)
    rows = []
    # (the reference's run of a configuration is not compared with itself)
    if reference and (name != ref.name or reference.key != run.key):
        pair = Pair(name, run, reference, w0)
        rows += _against_reference(pair, floor)
        rows += _state_rows(pair, floor)
        if "loss" in run.float64() and "loss" in reference.float64():
            rows.append(_same_math(pair))
    one = run.of(run.key.on(1))
    if run.key.devices > 1 and "loss" in one:
        one_ref = ref.run_like(one.key)
        one_floor = float32_floor(one_ref, w0) if one_ref else None
        rows.append(_k_vs_1(name, run, _larger(one_floor, floor)))
    return rows


def compare_nodes(
    name: str,
    single: Mapping,
    multi: Measurements,
    nodes: int,
    w0: dict[str, dict],
    reference: Mapping | None = None,
) -> list[CheckRow]:
    """A backend's runs on `nodes` nodes (`multi`) against its own 1-process runs of the same devices (`single`'s
    arrays): the same math in float64 (within FLOAT64_FACTOR x the float64 floor that `reference`, torch's
    measurements, holds for the configuration), and the float32 gradients within FLOOR_FACTOR x the larger of the
    two runs' own float32-vs-float64 distances (a fixed tolerance where the engine has no float64: then the row
    says why)."""
    arrays, skipped = multi
    rows = []
    for key in runs_of(arrays):
        about = {**_about(name, key), "devices": f"{key.devices} = {nodes}x{key.devices // nodes}"}
        many, one, start = Run(arrays, key), Run(single, key), w0[key.model]
        if "loss" not in one:
            rows.append(
                CheckRow(
                    check="nodes vs 1 process",
                    **about,
                    value=None,
                    tolerance=None,
                    status="not run",
                    note="no 1-process run to compare with",
                )
            )
            continue
        if "loss" in many.float64() and "loss" in one.float64():
            value = float64_distances(many.float64(), one.float64(), start)
            floor64 = float64_floor(reference or {}, key, start)
            worst, gap, tolerance, why = judged_float64(value, floor64, TOLERANCE["same math"])
            steps = len(many.float64()["losses"])
            rows.append(
                CheckRow(
                    check="nodes vs 1 process (float64)",
                    **about,
                    value=gap,
                    tolerance=tolerance,
                    status=_verdict(gap, tolerance),
                    note=f"{nodes} processes vs 1 process of {key.devices} devices, float64: loss, gradients, "
                    f"{steps} steps of weights; nearest its tolerance: {worst}; {why}",
                )
            )
            floor = max(distances(r, r.float64(), start)["gradients"] for r in (one, many))
        else:
            floor = 0.0
            rows.append(
                CheckRow(
                    check="nodes vs 1 process (float64)",
                    **about,
                    value=None,
                    tolerance=None,
                    status="not run",
                    note=skipped.get(key.to_str(), "no float64 run on nodes"),
                )
            )
        value = distances(many, one, start)["gradients"]
        tolerance, why = _allowed("gradients", {"gradients": floor})
        rows.append(
            CheckRow(
                check="nodes vs 1 process",
                **about,
                value=value,
                tolerance=tolerance,
                status=_verdict(value, tolerance),
                note="float32 gradients" + (f"; tolerance {why}" if why else ""),
            )
        )
    return rows


def distances(run: Run, ref: Run, w0) -> dict[str, float]:
    """How far `run` is from `ref` (two runs of one model), in each comparison's own measure."""
    names = _trainable(run.key.model)
    ref_loss = float(ref["loss"])
    # The first step: its distance relative to how far the reference's step moved the weights from w0.
    first_gap, _, moved, first_peak = _gap(
        run.stored("first"), ref.stored("first"), names, start=w0
    )
    return {
        "loss": abs(float(run["loss"]) - ref_loss) / abs(ref_loss),
        "gradients": _relative_gap(run.stored("grad"), ref.stored("grad"), names),
        "step": first_gap / moved if moved else first_gap,
        "trace": _trace_distance(run["losses"], ref["losses"]),
        "k-vs-1": first_peak,
        **state_distances(run, ref),
    }


def state_distances(run: Run, ref: Run) -> dict[str, float]:
    """How far the BatchNorm running statistics of `run` are from those of `ref`, after the first step ("state")
    and after the trace ("final state"); relative, L2 over every layer's mean and variance."""
    names = _statistics(run.key.model)
    if not names:
        return {}
    return {
        "state": _relative_gap(run.stored("first"), ref.stored("first"), names),
        "final state": _relative_gap(run.stored("final"), ref.stored("final"), names),
    }


def float64_distances(run: Run, ref: Run, w0) -> dict[str, float]:
    """What a float64 row compares of two float64 runs, each in its own measure: distances(), with the weights
    after the last step ("final", BatchNorm state included) in place of the k-vs-1 peak and the final state."""
    value = distances(run, ref, w0)
    names = _trainable(run.key.model) + _statistics(run.key.model)
    value["final"] = _relative_gap(run.stored("final"), ref.stored("final"), names)
    value.pop("k-vs-1")
    value.pop("final state", None)  # inside "final"
    return value


def float64_floor(reference: Mapping, key: MeasurementKey, w0) -> dict[str, float] | None:
    """How far float64 rounding alone moves each quantity a float64 row of the model, devices and BatchNorm mode
    of `key` compares: the reference's float64 run against itself with every shard's images permuted, over the
    same steps (common/checkjob.py's FLOOR_RUNS). None where the reference measured no floor."""
    in_order, permuted = Run(reference, key.run_of(IN_ORDER)), Run(reference, key.run_of(PERMUTED))
    if "loss" not in in_order or "loss" not in permuted:
        return None
    return float64_distances(permuted, in_order, w0)


def one_device_floor(reference: Mapping, model: str, w0) -> dict[str, float] | None:
    """The float64 floor of the first batch's loss and gradients on 1 device ("math (float64)")."""
    for bn in BN_MODES:
        floor = float64_floor(reference, MeasurementKey(model, IN_ORDER, 1, bn), w0)
        if floor is not None:
            return {q: floor[q] for q in ("loss", "gradients")}
    return None


def judged_float64(
    value: dict[str, float], floor: dict[str, float] | None, least: float
) -> tuple[str, float, float, str]:
    """A float64 row's verdict over its quantities: (the quantity nearest its tolerance, its value, its
    tolerance, the note on that tolerance). Each quantity may differ by FLOAT64_FACTOR x its float64 floor,
    and never less than `least`; without a measured floor, by `least`."""
    allowed = {
        q: max(least, FLOAT64_FACTOR * floor[q]) if floor and q in floor else least for q in value
    }
    worst = max(value, key=lambda q: value[q] / allowed[q])
    if not floor or worst not in floor:
        why = f"tolerance {least:.0e}: no float64 floor measured"
    elif FLOAT64_FACTOR * floor[worst] <= least:
        why = f"tolerance {least:.0e}, above {FLOAT64_FACTOR}x float64 floor {floor[worst]:.1e}"
    else:
        why = f"tolerance {FLOAT64_FACTOR}x float64 floor {floor[worst]:.1e}"
    return worst, value[worst], allowed[worst], why


def _float64_row(arrays, ref_arrays, model: str, name: str, floor: dict | None) -> CheckRow:
    names = _trainable(model)
    ref_loss = float(ref_arrays[float64_key(model, "loss")])
    grad = float64_key(model, "grad")
    value = {
        "loss": abs(float(arrays[float64_key(model, "loss")]) - ref_loss) / abs(ref_loss),
        "gradients": _relative_gap(Stored(arrays, grad), Stored(ref_arrays, grad), names),
    }
    worst, gap, tolerance, why = judged_float64(value, floor, TOLERANCE["float64"])
    return CheckRow(
        check="math (float64)",
        model=model,
        backend=name,
        strategy="(1 device)",
        devices="1",
        bn="-",
        value=gap,
        tolerance=tolerance,
        status=_verdict(gap, tolerance),
        note=f"loss and gradients in float64 vs torch's; nearest its tolerance: {worst}; {why}",
    )


def _same_math(pair: Pair) -> CheckRow:
    """The strategy's own float64 run against torch's float64 run of the same configuration: loss,
    gradients, the weights after the first and the last step (BatchNorm state included) and every loss,
    each within FLOAT64_FACTOR x its float64 floor: beyond that it is a difference in the math."""
    run, ref, model = pair.run.float64(), pair.ref.float64(), pair.run.key.model
    value = float64_distances(run, ref, pair.w0)
    floor = float64_floor(pair.ref.arrays, pair.run.key, pair.w0)
    worst, gap, tolerance, why = judged_float64(value, floor, TOLERANCE["same math"])
    state = " and BatchNorm state" if _statistics(model) else ""
    return CheckRow(
        check="same math (float64)",
        **_about(pair.backend, pair.run.key),
        value=gap,
        tolerance=tolerance,
        status=_verdict(gap, tolerance),
        note=f"vs torch {pair.ref.key.strategy}: loss, gradients, {len(run['losses'])} steps of weights"
        f"{state}; nearest its tolerance: {worst}; {why}",
    )


def _state_rows(pair: Pair, floor: dict | None) -> list[CheckRow]:
    """float32 BatchNorm running statistics vs torch's, after one step and after the trace (ResNet-18)."""
    value = state_distances(pair.run, pair.ref)
    if not value:
        return []
    steps = len(pair.run["losses"])
    about, versus = _about(pair.backend, pair.run.key), f"vs torch {pair.ref.key.strategy}"
    rows = []
    for check, label in (
        ("state", "BatchNorm state, one step"),
        ("final state", f"BatchNorm state, {steps} steps"),
    ):
        if check == "final state" and floor is not None and floor["trace"] > TOLERANCE["trace"]:
            rows.append(
                CheckRow(
                    check=label,
                    **about,
                    value=value[check],
                    tolerance=None,
                    status="measured",
                    note=f"{versus}; chaotic in float32 (see the loss trace)",
                )
            )
            continue
        tolerance, why = _allowed(check, floor, fixed=TOLERANCE["state"])
        rows.append(
            CheckRow(
                check=label,
                **about,
                value=value[check],
                tolerance=tolerance,
                status=_verdict(value[check], tolerance),
                note=versus + (f"; tolerance {why}" if why else ""),
            )
        )
    return rows


def widened_floor(floor: dict, run: Run, w0, own: float | None) -> dict:
    """The float32 floor of one row: the larger of torch's and this run's own float32-vs-float64 distance.

    This run's own distance is measured against its float64 run of the same configuration (same strategy,
    devices and BatchNorm mode) where it has one, else its 1-device gradient's. Since the float64 runs agree
    (the `same math` row), |run - torch| <= own + torch's floor <= 2x the larger: 3x is a sound tolerance."""
    if "loss" in run.float64():
        mine = distances(run, run.float64(), w0)
        return {
            **floor,
            **{
                c: max(floor[c], mine[c])
                for c in ("gradients", "step", "state")
                if c in floor and c in mine and mine[c] <= TOLERANCE["float32"]
            },
        }
    if own is not None and own <= TOLERANCE["float32"]:
        return {**floor, "gradients": max(floor["gradients"], own), "step": max(floor["step"], own)}
    return floor


def own_float32_error(arrays: Mapping, key: MeasurementKey) -> float | None:
    """How far this backend's own float32 gradient (1 device) of `key`'s model and strategy is from its float64
    one."""
    names = _trainable(key.model)
    exact = Stored(arrays, float64_key(key.model, "grad"))
    for bn in BN_MODES:
        one = Run(arrays, replace(key, devices=1, bn=bn))
        if "loss" in one and float64_key(key.model, "loss") in arrays:
            return _relative_gap(one.stored("grad"), exact, names)
    return None


def _trace_distance(losses, ref_losses) -> float:
    """max |loss - reference loss| over the steps both have (the float64 trace may be one step)."""
    n = min(len(losses), len(ref_losses))
    return float(np.max(np.abs(np.asarray(losses[:n]) - np.asarray(ref_losses[:n]))))


def float32_floor(reference: Run, w0) -> dict[str, float] | None:
    """The reference's own float32 rounding: how far torch's float32 run is from the same math in float64
    (the same devices, BatchNorm mode and trace).

    Two correct float32 implementations differ by about this much (they round in different orders),
    so a tolerance below FLOOR_FACTOR x floor would measure rounding, not the math."""
    exact = reference.of(reference.key.run_of(FLOAT64_RUN))
    if "loss" not in exact:
        return None
    return distances(reference, exact, w0)


def _forward_row(arrays, ref_arrays, model: str, mode: str, name: str) -> CheckRow:
    """max |logits - torch's logits|, within FLOOR_FACTOR x torch's own float32-vs-float64 distance where that is
    larger than the fixed tolerance (ResNet-50's 1,000 logits of a few units each round further than 1e-4)."""
    key = forward_key(model, mode)
    diff = float(np.max(np.abs(arrays[key].astype(np.float64) - ref_arrays[key])))
    exact = ref_arrays.get(forward_key(model, mode, "float64"))
    floor = None if exact is None else {"forward": float(np.max(np.abs(ref_arrays[key] - exact)))}
    tolerance, note = _allowed("forward", floor)
    return CheckRow(
        check="forward",
        model=model,
        backend=name,
        strategy=f"({mode} mode)",
        devices="1",
        bn="-",
        value=diff,
        tolerance=tolerance,
        status=_verdict(diff, tolerance) + (f" ({note})" if note else ""),
    )


def _allowed(check: str, floor: dict | None, fixed: float | None = None) -> tuple[float, str]:
    """The tolerance of one comparison and, when float32 rounding sets it, a note saying so."""
    fixed = TOLERANCE[check] if fixed is None else fixed
    if floor is None or check not in floor or FLOOR_FACTOR * floor[check] <= fixed:
        return fixed, ""
    return FLOOR_FACTOR * floor[check], f"{FLOOR_FACTOR}x float32-vs-float64 {floor[check]:.1e}"


def _against_reference(pair: Pair, floor: dict | None) -> list[CheckRow]:
    value = distances(pair.run, pair.ref, pair.w0)
    steps = len(pair.run["losses"])
    about, versus = _about(pair.backend, pair.run.key), f"vs torch {pair.ref.key.strategy}"
    rows = []
    for check, label in (
        ("loss", "loss"),
        ("gradients", "gradients"),
        ("step", "one step"),
        ("trace", f"{steps}-step loss"),
    ):
        if check == "trace" and floor is not None and floor["trace"] > TOLERANCE["trace"]:
            rows.append(
                CheckRow(
                    check=label,
                    **about,
                    value=value[check],
                    tolerance=None,
                    status="measured",
                    note=f"{versus}; chaotic in float32: torch's own float32 trace is "
                    f"{floor['trace']:.1e} from float64",
                )
            )
            continue
        tolerance, why = _allowed(check, floor)
        rows.append(
            CheckRow(
                check=label,
                **about,
                value=value[check],
                tolerance=tolerance,
                status=_verdict(value[check], tolerance),
                note=versus + (f"; tolerance {why}" if why else ""),
            )
        )
    return rows


def _larger(*floors: dict | None) -> dict | None:
    """The float32 floor of a comparison of two runs: each floor's larger figure. The k-device and the 1-device
    float32 runs are each that far from their float64 math at most, so from each other within twice it (with
    --bn sync, the k-device run's reduction of the statistics rounds more than the 1-device run's)."""
    present = [f for f in floors if f]
    if not present:
        return None
    return {c: max(f[c] for f in present if c in f) for c in set().union(*present)}


def _k_vs_1(name: str, run: Run, floor: dict | None) -> CheckRow:
    """The largest difference of the weights after one step on k devices from those on 1 device: judged where
    the math makes them the same (LeNet, or BatchNorm over the global batch), measured where it does not."""
    one = run.of(run.key.on(1))
    diff = _gap(run.stored("first"), one.stored("first"), _trainable(run.key.model))[3]
    about = _about(name, run.key)
    if run.key.model == "lenet" or run.key.bn == "sync":
        tolerance, why = _allowed("k-vs-1", floor)
        return CheckRow(
            check="k vs 1 device",
            **about,
            value=diff,
            tolerance=tolerance,
            status=_verdict(diff, tolerance),
            note=f"tolerance {why}" if why else "",
        )
    return CheckRow(
        check="k vs 1 device",
        **about,
        value=diff,
        tolerance=None,
        status="measured",
        note="per-device BatchNorm statistics: k devices normalise over B/k examples each, by design",
    )


# --------------------------------------------------------------------------- output


def table(rows: list[CheckRow]) -> list[str]:
    return tables.table(
        [
            "check",
            "model",
            "backend",
            "strategy",
            "devices",
            "bn",
            "max difference",
            "tolerance",
            "result",
        ],
        [
            [
                r.check,
                r.model,
                r.backend,
                r.strategy,
                str(r.devices),
                r.bn,
                fmt(r.value, ".2e"),
                fmt(r.tolerance, ".0e"),
                r.status + (f" ({r.note})" if r.note else ""),
            ]
            for r in rows
        ],
    )
