"""The equivalence table's comparisons: measurements of every backend (common/measurements.py, run by
harness/check.py) against torch's, each with its tolerance, as table rows. Pure numpy, no process."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from common.architectures import spec
from common.measurements import FLOOR_RUNS, IN_ORDER, PERMUTED
from harness import tables
from harness.tables import fmt

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


FLOAT64 = (
    ":float64"  # a strategy's float64 run is stored as <strategy>:float64 (common/measurements.py)
)


@dataclass
class Row:
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


def _trainable(model: str) -> list[str]:
    return [n for n, _, kind in spec(model) if kind not in ("bn_mean", "bn_var")]


def _statistics(model: str) -> list[str]:
    """BatchNorm running means and variances: state, not parameters, but part of the math (evaluation uses them)."""
    return [n for n, _, kind in spec(model) if kind in ("bn_mean", "bn_var")]


def _gap(arrays, key: str, ref_arrays, ref: str, names: list[str], start: dict | None = None):
    """(||a - b||, ||b||, ||b - start||, max |a - b|) over the parameters `names`, a = arrays[key|name] and
    b = ref_arrays[ref|name] in float64. One parameter at a time, each read, compared and dropped: the check
    never holds a whole model's measurements (ResNet-50's are 100 MB each in float32)."""
    diff2 = ref2 = moved2 = peak = 0.0
    for n in names:
        a = np.asarray(arrays[f"{key}|{n}"], dtype=np.float64).ravel()
        b = np.asarray(ref_arrays[f"{ref}|{n}"], dtype=np.float64).ravel()
        d = a - b
        diff2, ref2 = diff2 + float(d @ d), ref2 + float(b @ b)
        peak = max(peak, float(np.max(np.abs(d)))) if d.size else peak
        if start is not None:
            m = b - np.asarray(start[n], dtype=np.float64).ravel()
            moved2 += float(m @ m)
    return math.sqrt(diff2), math.sqrt(ref2), math.sqrt(moved2), peak


def _relative_gap(arrays, key: str, ref_arrays, ref: str, names: list[str]) -> float:
    """||a - b|| / ||b|| over the parameters `names` (||a - b|| where b is zero): _gap's measure of a row."""
    diff, norm, _, _ = _gap(arrays, key, ref_arrays, ref, names)
    return diff / norm if norm else diff


def _verdict(value: float, tolerance: float) -> str:
    return "ok" if value <= tolerance else "FAIL"


def runs_of(arrays: dict) -> list[tuple[str, str, int, str]]:
    """(model, strategy, devices, bn) of every measured configuration (not the float64 reference)."""
    found = set()
    for key in arrays:
        parts = key.split("|")
        if (
            len(parts) == 5
            and parts[4] == "loss"
            and parts[1] not in ("float64", *FLOOR_RUNS)  # the reference's own float64 runs
            and not parts[1].endswith(FLOAT64)
        ):
            found.add((parts[0], parts[1], int(parts[2]), parts[3]))
    return sorted(found)


def compare(
    results: dict[str, tuple[dict, dict]], w0: dict[str, dict], reference: str = "torch"
) -> list[Row]:
    rows: list[Row] = []
    ref_arrays = results[reference][0]
    ref_runs = runs_of(ref_arrays)

    def reference_key(model, k, bn):
        return next(
            (f"{m}|{s}|{n}|{b}" for m, s, n, b in ref_runs if (m, n, b) == (model, k, bn)), None
        )

    for name, (arrays, skipped) in results.items():
        own_rows = set()
        for model in sorted({k.split("|")[0] for k in arrays if "|forward|" in k}):
            if name != reference:
                for mode in ("train", "eval"):
                    rows.append(_forward_row(arrays, ref_arrays, model, mode, name))
                if f"{model}|float64|loss" in arrays and f"{model}|float64|loss" in ref_arrays:
                    one = one_device_floor(ref_arrays, model, w0[model])
                    rows.append(_float64_row(arrays, ref_arrays, model, name, one))
        for model, strategy, k, bn in runs_of(arrays):
            key = f"{model}|{strategy}|{k}|{bn}"
            ref = reference_key(model, k, bn)
            floor = (
                float32_floor(ref_arrays, ref, f"{model}|float64|{k}|{bn}", model, w0[model])
                if ref
                else None
            )
            own = own_float32_error(arrays, model, strategy)
            if own is not None and (model, strategy) not in own_rows:
                own_rows.add((model, strategy))
                rows.append(
                    Row(
                        "float32 vs float64",
                        model,
                        name,
                        strategy,
                        "1",
                        "-",
                        own,
                        TOLERANCE["float32"],
                        _verdict(own, TOLERANCE["float32"]),
                        "this backend's float32 gradient vs its float64 one",
                    )
                )
            if floor is not None:
                floor = widened_floor(floor, arrays, key, model, w0[model], own)
            if ref and (name != reference or ref != key):
                rows += _against_reference(
                    arrays, ref_arrays, key, ref, model, name, strategy, k, bn, w0[model], floor
                )
            if ref:
                rows += _state_rows(
                    arrays, ref_arrays, key, ref, model, name, strategy, k, bn, floor
                )
            f64, ref64 = float64_key(key), float64_key(ref) if ref else None
            both_in_float64 = ref64 and f"{f64}|loss" in arrays and f"{ref64}|loss" in ref_arrays
            if both_in_float64 and (name != reference or ref != key):
                rows.append(
                    _same_math(
                        arrays, ref_arrays, f64, ref64, model, name, strategy, k, bn, w0[model]
                    )
                )
            if k > 1 and f"{model}|{strategy}|1|{bn}|loss" in arrays:
                one_ref = reference_key(model, 1, bn)
                one_floor = (
                    float32_floor(ref_arrays, one_ref, f"{model}|float64|1|{bn}", model, w0[model])
                    if one_ref
                    else None
                )
                rows.append(
                    _k_vs_1(
                        arrays,
                        key,
                        f"{model}|{strategy}|1|{bn}",
                        model,
                        name,
                        strategy,
                        k,
                        bn,
                        _larger(one_floor, floor),
                    )
                )
        for key, reason in skipped.items():
            model, strategy, k, bn = key.split("|")
            rows.append(Row("all", model, name, strategy, k, bn, None, None, "not run", reason))
    return rows


def compare_nodes(
    name: str,
    single: dict,
    multi: dict,
    skipped: dict,
    nodes: int,
    w0: dict[str, dict],
    reference: dict | None = None,
) -> list[Row]:
    """A backend's runs on `nodes` nodes against its own 1-process runs of the same devices: the same math
    in float64 (within FLOAT64_FACTOR x the float64 floor that `reference`, torch's measurements, holds for
    the configuration), and the float32 gradients within FLOOR_FACTOR x the larger of the two runs' own
    float32-vs-float64 distances (a fixed tolerance where the engine has no float64: then the row says why)."""
    rows = []
    for model, strategy, k, bn in runs_of(multi):
        key, devices = f"{model}|{strategy}|{k}|{bn}", f"{k} = {nodes}x{k // nodes}"
        if f"{key}|loss" not in single:
            rows.append(
                Row(
                    "nodes vs 1 process",
                    model,
                    name,
                    strategy,
                    devices,
                    bn,
                    None,
                    None,
                    "not run",
                    "no 1-process run to compare with",
                )
            )
            continue
        f64 = float64_key(key)
        if f"{f64}|loss" in multi and f"{f64}|loss" in single:
            value = float64_distances(multi, single, f64, f64, model, w0[model])
            floor64 = float64_floor(reference or {}, model, k, bn, w0[model])
            worst, gap, tolerance, why = judged_float64(value, floor64, TOLERANCE["same math"])
            rows.append(
                Row(
                    "nodes vs 1 process (float64)",
                    model,
                    name,
                    strategy,
                    devices,
                    bn,
                    gap,
                    tolerance,
                    _verdict(gap, tolerance),
                    f"{nodes} processes vs 1 process of {k} devices, float64: loss, gradients, "
                    f"{len(multi[f'{f64}|losses'])} steps of weights; nearest its tolerance: {worst}; {why}",
                )
            )
            floor = max(
                distances(a, a, key, f64, model, w0[model])["gradients"] for a in (single, multi)
            )
        else:
            floor = 0.0
            rows.append(
                Row(
                    "nodes vs 1 process (float64)",
                    model,
                    name,
                    strategy,
                    devices,
                    bn,
                    None,
                    None,
                    "not run",
                    skipped.get(key, "no float64 run on nodes"),
                )
            )
        value = distances(multi, single, key, key, model, w0[model])["gradients"]
        tolerance, why = _allowed("gradients", {"gradients": floor})
        rows.append(
            Row(
                "nodes vs 1 process",
                model,
                name,
                strategy,
                devices,
                bn,
                value,
                tolerance,
                _verdict(value, tolerance),
                "float32 gradients" + (f"; tolerance {why}" if why else ""),
            )
        )
    return rows


def float64_key(key: str) -> str:
    """model|strategy|k|bn -> model|strategy:float64|k|bn: the same configuration's float64 run."""
    model, strategy, k, bn = key.split("|")
    return f"{model}|{strategy}{FLOAT64}|{k}|{bn}"


def distances(arrays, ref_arrays, key, ref, model, w0) -> dict[str, float]:
    """How far run `key` is from run `ref`, in each comparison's own measure."""
    names = _trainable(model)
    ref_loss = float(ref_arrays[f"{ref}|loss"])
    # The first step: its distance relative to how far the reference's step moved the weights from w0.
    first_gap, _, moved, first_peak = _gap(
        arrays, f"{key}|first", ref_arrays, f"{ref}|first", names, start=w0
    )
    return {
        "loss": abs(float(arrays[f"{key}|loss"]) - ref_loss) / abs(ref_loss),
        "gradients": _relative_gap(arrays, f"{key}|grad", ref_arrays, f"{ref}|grad", names),
        "step": first_gap / moved if moved else first_gap,
        "trace": _trace_distance(arrays[f"{key}|losses"], ref_arrays[f"{ref}|losses"]),
        "k-vs-1": first_peak,
        **state_distances(arrays, ref_arrays, key, ref, model),
    }


def state_distances(arrays, ref_arrays, key, ref, model) -> dict[str, float]:
    """How far the BatchNorm running statistics of run `key` are from those of `ref`, after the first
    step ("state") and after the trace ("final state"); relative, L2 over every layer's mean and variance."""
    names = _statistics(model)
    if not names:
        return {}
    return {
        "state": _relative_gap(arrays, f"{key}|first", ref_arrays, f"{ref}|first", names),
        "final state": _relative_gap(arrays, f"{key}|final", ref_arrays, f"{ref}|final", names),
    }


def float64_distances(arrays, ref_arrays, key, ref, model, w0) -> dict[str, float]:
    """What a float64 row compares of two float64 runs, each in its own measure: distances(), with the weights
    after the last step ("final", BatchNorm state included) in place of the k-vs-1 peak and the final state."""
    value = distances(arrays, ref_arrays, key, ref, model, w0)
    names = _trainable(model) + _statistics(model)
    value["final"] = _relative_gap(arrays, f"{key}|final", ref_arrays, f"{ref}|final", names)
    value.pop("k-vs-1")
    value.pop("final state", None)  # inside "final"
    return value


def float64_floor(ref_arrays, model: str, k: int, bn: str, w0) -> dict[str, float] | None:
    """How far float64 rounding alone moves each quantity a float64 row of `k` devices and BatchNorm `bn`
    compares: the reference's float64 run against itself with every shard's images permuted, over the same
    steps (common/measurements.py's FLOOR_RUNS). None where the reference measured no floor."""
    in_order, permuted = f"{model}|{IN_ORDER}|{k}|{bn}", f"{model}|{PERMUTED}|{k}|{bn}"
    if f"{in_order}|loss" not in ref_arrays or f"{permuted}|loss" not in ref_arrays:
        return None
    return float64_distances(ref_arrays, ref_arrays, permuted, in_order, model, w0)


def one_device_floor(ref_arrays, model: str, w0) -> dict[str, float] | None:
    """The float64 floor of the first batch's loss and gradients on 1 device ("math (float64)")."""
    for bn in ("local", "sync"):
        if (floor := float64_floor(ref_arrays, model, 1, bn, w0)) is not None:
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


def _float64_row(arrays, ref_arrays, model, name, floor: dict | None) -> Row:
    names = _trainable(model)
    ref_loss = float(ref_arrays[f"{model}|float64|loss"])
    value = {
        "loss": abs(float(arrays[f"{model}|float64|loss"]) - ref_loss) / abs(ref_loss),
        "gradients": _relative_gap(
            arrays, f"{model}|float64|grad", ref_arrays, f"{model}|float64|grad", names
        ),
    }
    worst, gap, tolerance, why = judged_float64(value, floor, TOLERANCE["float64"])
    return Row(
        "math (float64)",
        model,
        name,
        "(1 device)",
        "1",
        "-",
        gap,
        tolerance,
        _verdict(gap, tolerance),
        f"loss and gradients in float64 vs torch's; nearest its tolerance: {worst}; {why}",
    )


def _same_math(arrays, ref_arrays, key, ref, model, name, strategy, k, bn, w0) -> Row:
    """The strategy's own float64 run against torch's float64 run of the same configuration: loss,
    gradients, the weights after the first and the last step (BatchNorm state included) and every loss,
    each within FLOAT64_FACTOR x its float64 floor: beyond that it is a difference in the math."""
    value = float64_distances(arrays, ref_arrays, key, ref, model, w0)
    floor = float64_floor(ref_arrays, model, k, bn, w0)
    worst, gap, tolerance, why = judged_float64(value, floor, TOLERANCE["same math"])
    steps = len(arrays[f"{key}|losses"])
    return Row(
        "same math (float64)",
        model,
        name,
        strategy,
        str(k),
        bn,
        gap,
        tolerance,
        _verdict(gap, tolerance),
        f"vs torch {ref.split('|')[1].removesuffix(FLOAT64)}: loss, gradients, {steps} steps of weights"
        f"{' and BatchNorm state' if _statistics(model) else ''}; nearest its tolerance: {worst}; {why}",
    )


def _state_rows(arrays, ref_arrays, key, ref, model, name, strategy, k, bn, floor) -> list[Row]:
    """float32 BatchNorm running statistics vs torch's, after one step and after the trace (ResNet-18)."""
    value = state_distances(arrays, ref_arrays, key, ref, model)
    if not value or (name == "torch" and ref == key):
        return []
    steps = len(arrays[f"{key}|losses"])
    rows = []
    for check, label in (
        ("state", "BatchNorm state, one step"),
        ("final state", f"BatchNorm state, {steps} steps"),
    ):
        if check == "final state" and floor is not None and floor["trace"] > TOLERANCE["trace"]:
            rows.append(
                Row(
                    label,
                    model,
                    name,
                    strategy,
                    str(k),
                    bn,
                    value[check],
                    None,
                    "measured",
                    f"vs torch {ref.split('|')[1]}; chaotic in float32 (see the loss trace)",
                )
            )
            continue
        tolerance, why = _allowed(check, floor, fixed=TOLERANCE["state"])
        note = f"vs torch {ref.split('|')[1]}" + (f"; tolerance {why}" if why else "")
        rows.append(
            Row(
                label,
                model,
                name,
                strategy,
                str(k),
                bn,
                value[check],
                tolerance,
                _verdict(value[check], tolerance),
                note,
            )
        )
    return rows


def widened_floor(floor: dict, arrays, key, model, w0, own: float | None) -> dict:
    """The float32 floor of one row: the larger of torch's and this run's own float32-vs-float64 distance.

    This run's own distance is measured against its float64 run of the same configuration (same strategy,
    devices and BatchNorm mode) where it has one, else its 1-device gradient's. Since the float64 runs agree
    (the `same math` row), |run - torch| <= own + torch's floor <= 2x the larger: 3x is a sound tolerance."""
    f64 = float64_key(key)
    if f"{f64}|loss" in arrays:
        mine = distances(arrays, arrays, key, f64, model, w0)
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


def own_float32_error(arrays, model, strategy) -> float | None:
    """How far this backend's own float32 gradient (1 device) is from its float64 one."""
    names = _trainable(model)
    for bn in ("local", "sync"):
        if f"{model}|{strategy}|1|{bn}|loss" in arrays and f"{model}|float64|loss" in arrays:
            return _relative_gap(
                arrays, f"{model}|{strategy}|1|{bn}|grad", arrays, f"{model}|float64|grad", names
            )
    return None


def _trace_distance(losses, ref_losses) -> float:
    """max |loss - reference loss| over the steps both have (the float64 trace may be one step)."""
    n = min(len(losses), len(ref_losses))
    return float(np.max(np.abs(np.asarray(losses[:n]) - np.asarray(ref_losses[:n]))))


def float32_floor(ref_arrays, ref, f64, model, w0) -> dict[str, float] | None:
    """The reference's own float32 rounding: how far torch's float32 run is from the same math in float64
    (the same devices, BatchNorm mode and trace).

    Two correct float32 implementations differ by about this much (they round in different orders),
    so a tolerance below FLOOR_FACTOR x floor would measure rounding, not the math."""
    if f"{f64}|loss" not in ref_arrays:
        return None
    return distances(ref_arrays, ref_arrays, ref, f64, model, w0)


def _forward_row(arrays, ref_arrays, model: str, mode: str, name: str) -> Row:
    """max |logits - torch's logits|, within FLOOR_FACTOR x torch's own float32-vs-float64 distance where that is
    larger than the fixed tolerance (ResNet-50's 1,000 logits of a few units each round further than 1e-4)."""
    key = f"{model}|forward|{mode}"
    diff = float(np.max(np.abs(arrays[key].astype(np.float64) - ref_arrays[key])))
    exact = ref_arrays.get(f"{model}|float64|forward|{mode}")
    floor = None if exact is None else {"forward": float(np.max(np.abs(ref_arrays[key] - exact)))}
    tolerance, note = _allowed("forward", floor)
    return Row(
        "forward",
        model,
        name,
        f"({mode} mode)",
        "1",
        "-",
        diff,
        tolerance,
        _verdict(diff, tolerance) + (f" ({note})" if note else ""),
    )


def _allowed(check: str, floor: dict | None, fixed: float | None = None) -> tuple[float, str]:
    """The tolerance of one comparison and, when float32 rounding sets it, a note saying so."""
    fixed = TOLERANCE[check] if fixed is None else fixed
    if floor is None or check not in floor or FLOOR_FACTOR * floor[check] <= fixed:
        return fixed, ""
    return FLOOR_FACTOR * floor[check], f"{FLOOR_FACTOR}x float32-vs-float64 {floor[check]:.1e}"


def _against_reference(
    arrays, ref_arrays, key, ref, model, name, strategy, k, bn, w0, floor
) -> list[Row]:
    value = distances(arrays, ref_arrays, key, ref, model, w0)
    steps = len(arrays[f"{key}|losses"])
    rows = []
    for check, label in (
        ("loss", "loss"),
        ("gradients", "gradients"),
        ("step", "one step"),
        ("trace", f"{steps}-step loss"),
    ):
        if check == "trace" and floor is not None and floor["trace"] > TOLERANCE["trace"]:
            rows.append(
                Row(
                    label,
                    model,
                    name,
                    strategy,
                    str(k),
                    bn,
                    value[check],
                    None,
                    "measured",
                    f"vs torch {ref.split('|')[1]}; chaotic in float32: torch's own float32 trace is "
                    f"{floor['trace']:.1e} from float64",
                )
            )
            continue
        tolerance, why = _allowed(check, floor)
        note = f"vs torch {ref.split('|')[1]}" + (f"; tolerance {why}" if why else "")
        rows.append(
            Row(
                label,
                model,
                name,
                strategy,
                str(k),
                bn,
                value[check],
                tolerance,
                _verdict(value[check], tolerance),
                note,
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


def _k_vs_1(arrays, key, one, model, name, strategy, k, bn, floor) -> Row:
    names = _trainable(model)
    diff = _gap(arrays, f"{key}|first", arrays, f"{one}|first", names)[3]
    if model == "lenet" or bn == "sync":
        tolerance, why = _allowed("k-vs-1", floor)
        return Row(
            "k vs 1 device",
            model,
            name,
            strategy,
            str(k),
            bn,
            diff,
            tolerance,
            _verdict(diff, tolerance),
            f"tolerance {why}" if why else "",
        )
    return Row(
        "k vs 1 device",
        model,
        name,
        strategy,
        str(k),
        bn,
        diff,
        None,
        "measured",
        "per-device BatchNorm statistics: k devices normalise over B/k examples each, by design",
    )


# --------------------------------------------------------------------------- output


def table(rows: list[Row]) -> list[str]:
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
