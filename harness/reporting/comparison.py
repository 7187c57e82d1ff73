"""Whether one run is slower or faster than another, beyond noise: the test and marks of `compare`, which `history`
marks its points with and `parity` takes its interval from (each command's docstring says what it shows).

A row is a configuration (backend, strategy with its options and levers, devices, nodes), its figures the medians
over its kept trials (trials.py). The test is a two-level bootstrap of the ratio of the median step times: the kept
trials resampled with replacement, then each resampled trial's timed steps, so that the spread between processes
(which on a shared host is larger than the spread within one) counts. A row is marked as `asv compare` marks a
benchmark: `+` (slower: worse) when its median step time grew by more than the factor and the bootstrap's
(1 - alpha) interval of the ratio lies above 1, `-` (faster: better) for the mirror case, `~` otherwise, `x` when
the rows are not comparable (another recipe, framework version, device, precision or machine, named), `?` (this
suite's own) for a row present in one run only.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from common.results import Result
from harness.reporting import provenance
from harness.reporting.trials import Trials, group

# The config fields a run's figures depend on besides the row's own key: a difference makes rows incomparable.
COMPARABLE = (
    "model",
    "batch_size",
    "lr",
    "epochs",
    "train_size",
    "test_size",
    "eval_batch_size",
    "dataset",
    "image_size",
    "bn",
    "init",
    "seed",
    "timed_steps",
    "target_accuracy",
    "simulated",
)
ACCEPTABLE = ("versions", "devices")
MIN_SAMPLES = 3  # step samples per side: below this no interval means anything
RESAMPLES = 2000  # bootstrap resamples of each side
# The marks, asv's: a step time that grew is worse, `+`, as in `asv compare`.
SLOWER, FASTER, NO_CHANGE, NOT_COMPARABLE, ONE_SIDE = "+", "-", "~", "x", "?"


@dataclass(frozen=True)
class Thresholds:
    """What a verdict is judged by: a median step time beyond `factor` (or below 1/`factor`) with the bootstrap's
    (1 - `alpha`) interval clear of 1; a final accuracy that moved by more than `accuracy_tolerance`; and what may
    differ between the runs and is compared anyway (`accept`: "versions", "devices")."""

    factor: float = 1.1
    alpha: float = 0.05
    accuracy_tolerance: float = 0.01
    accept: frozenset[str] = frozenset()


# ------------------------------------------------------------------------ the test


def resampled_medians(
    trials: list[list[float]], rng: np.random.Generator, resamples: int = RESAMPLES
) -> np.ndarray:
    """The median step time of `resamples` bootstrap copies of one run: its trials drawn with replacement, then
    each drawn trial's steps drawn with replacement."""
    out = np.empty(resamples)
    for i in range(resamples):
        drawn = [trials[j] for j in rng.integers(len(trials), size=len(trials))]
        out[i] = np.median(np.concatenate([rng.choice(t, size=len(t)) for t in drawn]))
    return out


def ratio_interval(
    old: list[list[float]], new: list[list[float]], alpha: float, seed: int = 0
) -> tuple[float, float]:
    """The central (1 - alpha) bootstrap interval of median(NEW steps) / median(OLD steps), each side a list of
    trials, each trial a list of step seconds. Seeded: the same runs give the same verdict."""
    rng = np.random.default_rng(seed)
    ratios = resampled_medians(new, rng) / resampled_medians(old, rng)
    low, high = np.quantile(ratios, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


# ------------------------------------------------------------------------ rows


def row_key(t: Trials) -> tuple:
    c = t.config
    return c.backend, c.variant, c.devices, c.nodes.count


def incomparable(old: Trials, new: Trials, accept: set[str]) -> list[str]:
    """Why the two rows' figures do not measure the same thing ([] if they do)."""
    a, b = old.representative(), new.representative()
    why = [
        f"{name} {getattr(a.config, name)} vs {getattr(b.config, name)}"
        for name in COMPARABLE
        if getattr(a.config, name) != getattr(b.config, name)
    ]
    for name, label in (("weights_hash", "initial weights"), ("data_hash", "batch sequence")):
        ha, hb = base_hash(old, name), base_hash(new, name)
        if ha and hb and ha != hb:
            why.append(f"{label} hash {ha[:12]} vs {hb[:12]}")
    ea, eb = a.environment, b.environment
    if "versions" not in accept and ea.get("framework_version") != eb.get("framework_version"):
        why.append(
            f"{ea.get('framework', 'framework')} {ea.get('framework_version')} vs "
            f"{eb.get('framework_version')}"
        )
    if "devices" not in accept and (a.config.device_kind, ea.get("devices")) != (
        b.config.device_kind,
        eb.get("devices"),
    ):
        why.append(
            f"devices {a.config.device_kind} {ea.get('devices')} vs {b.config.device_kind} {eb.get('devices')}"
        )
    if (ea.get("precision") or {}).get("mode") != (eb.get("precision") or {}).get("mode"):
        why.append(
            f"precision {(ea.get('precision') or {}).get('mode')} vs {(eb.get('precision') or {}).get('mode')}"
        )
    return why


def base_hash(t: Trials, name: str) -> str | None:
    """A row's weights or batch-sequence hash: its trials' on the run's own batch order (a time-to-accuracy trial
    after the first trains on an order of its own: harness/planning/plan.py trial_config)."""
    hashes = [getattr(r, name) for r in t.runs if r.config.order_seed is None and getattr(r, name)]
    return hashes[0] if hashes else None


@dataclass
class Verdict:
    key: tuple
    mark: str  # SLOWER, FASTER, NO_CHANGE, NOT_COMPARABLE or ONE_SIDE
    old_step: float | None = None
    new_step: float | None = None
    old_images: float | None = None
    new_images: float | None = None
    interval: tuple[float, float] | None = None  # of the step-time ratio NEW / OLD
    samples: tuple[int, int] = (0, 0)
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return self.new_step / self.old_step if self.old_step and self.new_step else None


def judge(old: Trials, new: Trials, limits: Thresholds, machines: tuple = (None, None)) -> Verdict:
    """The row's verdict, `machines` the two runs' (provenance.machine; None where unknown); with the energy of
    both where both measured it on the same machine (another machine's counters measure other hardware)."""
    v = across_machines(judge_figures(old, new, limits), *machines, limits.accept)
    if v.mark not in (NOT_COMPARABLE, ONE_SIDE) and not provenance.machine_change(*machines):
        v.note = join_notes(v.note, energy_note(old, new))
    return v


def energy_per_epoch(t: Trials) -> tuple[str, float] | None:
    """(what was measured, the median joules per epoch) over the kept trials that measured energy, or None."""
    records = [r.energy for r in t.kept if r.energy and r.energy.get("measured")]
    if not records:
        return None
    return records[0]["scope"], statistics.median(e["joules_per_epoch"] for e in records)


def energy_note(old: Trials, new: Trials) -> str:
    """The change of the joules per epoch, where both sides measured them with the same counters; why NEW has none,
    where it says."""
    a, b = energy_per_epoch(old), energy_per_epoch(new)
    unmeasured = [r.energy["why"] for r in new.kept if r.energy and not r.energy.get("measured")]
    if not b and unmeasured:
        return f"energy not measured in NEW: {unmeasured[0]}"
    if not a or not b:
        return ""
    if a[0] != b[0]:
        return f"energy not compared: {a[0]} vs {b[0]}"
    return f"energy {a[1]:.4g} -> {b[1]:.4g} J/epoch ({b[1] / a[1] - 1:+.1%}, {a[0]})"


def across_machines(v: Verdict, old: dict | None, new: dict | None, accept: set[str]) -> Verdict:
    """A verdict of figures from two machines: `x` naming the difference (kept, noted, with --accept devices);
    a speed mark beside an unknown machine says so."""
    if v.mark in (NOT_COMPARABLE, ONE_SIDE):
        return v
    moved = provenance.machine_change(old, new)
    unknown = [side for side, m in (("OLD", old), ("NEW", new)) if m is None]
    if moved and "devices" in accept:
        v.note = join_notes(f"another machine (accepted): {moved}", v.note)
    elif moved:
        v.mark, v.note = NOT_COMPARABLE, join_notes(f"another machine: {moved}", v.note)
    elif unknown and v.mark in (SLOWER, FASTER):
        v.note = join_notes(f"machine unknown for {' and '.join(unknown)}", v.note)
    return v


def join_notes(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def judge_figures(old: Trials, new: Trials, limits: Thresholds) -> Verdict:
    """The row's verdict on its figures alone (which machine measured them aside)."""
    key = row_key(old)
    why = incomparable(old, new, limits.accept)
    if why:
        return Verdict(key, NOT_COMPARABLE, note="not comparable: " + "; ".join(why))
    a, b = old.step_samples(by_trial=True), new.step_samples(by_trial=True)
    na, nb = sum(map(len, a)), sum(map(len, b))
    v = Verdict(
        key,
        NO_CHANGE,
        old_images=old.median("images_per_s"),
        new_images=new.median("images_per_s"),
        samples=(na, nb),
    )
    if not na or not nb:
        v.note = "no step times to compare"
        return v
    v.old_step, v.new_step = (
        statistics.median(old.step_samples()),
        statistics.median(new.step_samples()),
    )
    notes = []
    if min(na, nb) < MIN_SAMPLES:
        notes.append(f"too few samples for the test ({na} and {nb})")
    else:
        v.interval = ratio_interval(a, b, limits.alpha)
        low, high = v.interval
        if low > 1 and v.ratio > limits.factor:
            v.mark = SLOWER
        elif high < 1 and v.ratio < 1 / limits.factor:
            v.mark = FASTER
        elif low > 1 or high < 1:
            notes.append(f"significant but within the factor {limits.factor:g}")
    acc_old, acc_new = old.median("test_acc"), new.median("test_acc")
    if (
        acc_old is not None
        and acc_new is not None
        and abs(acc_new - acc_old) > limits.accuracy_tolerance
    ):
        notes.append(
            f"accuracy drift {acc_old:.4f} -> {acc_new:.4f} (beyond {limits.accuracy_tolerance:g})"
        )
    notes += target_notes(old, new)
    v.note = "; ".join(notes)
    return v


def target_notes(old: Trials, new: Trials) -> list[str]:
    """Time to target, judged by the spread of the trials (each trial trains on its own batch order, so the spread
    is what rounding alone gives a run's convergence): a change where the two ranges do not overlap; a target one
    side reaches in every trial and the other in none."""
    times = []
    for side in (old, new):
        records = [r.target for r in side.kept if r.target]
        if not records:
            return []
        times.append(sorted(t["train_s"] for t in records if t["reached"]))
    (a, b) = times
    if bool(a) != bool(b):
        return [f"target reached {'only in NEW' if b else 'only in OLD'}"]
    if not a:
        return []
    span = f"time to target {statistics.median(a):.1f} -> {statistics.median(b):.1f} s"
    if b[0] > a[-1]:
        return [
            f"{span}: slower beyond the trials' spread ({a[0]:.1f}-{a[-1]:.1f} vs {b[0]:.1f}-{b[-1]:.1f})"
        ]
    if b[-1] < a[0]:
        return [
            f"{span}: faster beyond the trials' spread ({a[0]:.1f}-{a[-1]:.1f} vs {b[0]:.1f}-{b[-1]:.1f})"
        ]
    return []


def compare(
    old: list[Result], new: list[Result], limits: Thresholds, machines: tuple = (None, None)
) -> list[Verdict]:
    """Every row's verdict; `machines` the two runs' (provenance.machine; None where unknown)."""
    olds = {row_key(t): t for t in group(old)}
    news = {row_key(t): t for t in group(new)}
    verdicts = [
        judge(olds[k], news[k], limits, machines)
        if k in news
        else Verdict(k, ONE_SIDE, note="only in OLD")
        for k in olds
    ]
    return verdicts + [Verdict(k, ONE_SIDE, note="only in NEW") for k in news if k not in olds]


def machine_of(meta: dict) -> dict | None:
    """The machine a report's meta records (None: unknown)."""
    return provenance.machine_of(meta.get("provenance"))


def legend(limits: Thresholds) -> str:
    return (
        f"Marks: {SLOWER} slower, {FASTER} faster (median step time beyond x{limits.factor:g}, and the "
        f"bootstrap's {100 * (1 - limits.alpha):g}% interval of the step-time ratio, over trials and their steps, "
        f"excludes 1), {NO_CHANGE} no significant change, {NOT_COMPARABLE} not comparable (another recipe, "
        "framework version, device, precision or machine: the note names it), "
        f"{ONE_SIDE} in one run only."
    )
