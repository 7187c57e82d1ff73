"""`python -m harness compare OLD NEW [NEW ...]`: did a run get slower or faster than another, beyond noise?

Each NEW is compared with OLD, row by row: a row is a configuration (backend, strategy with its options and
levers, devices, nodes), its figures the medians over its kept trials (harness/reporting/trials.py). The test is a
two-level bootstrap of the ratio of the median step times: the kept trials resampled with replacement, then
each resampled trial's timed steps, so that the spread between processes (which on a shared host is larger
than the spread within one) counts. A row is marked as `asv compare` marks a benchmark: `+` (slower: worse)
when its median step time grew by more than --factor and the bootstrap's (1 - --alpha) interval of the ratio
lies above 1, `-` (faster: better) for the mirror case, `~` otherwise (no significant change), `x` when the rows
are not comparable; `?` (this suite's own) marks a row present in one run only. The exit status is 1 if any row
is slower, 2 on bad input.

Rows are compared only where the comparison means something: the same initial weights and batch sequence
(hashes), the same training recipe (the config fields of COMPARABLE), framework versions, device kind and
effective precision. Other rows are flagged with the reason, not compared; `--accept versions` (a framework
upgrade) or `--accept devices` (another machine) compares across what the user means to change.

Rows of two runs on different machines (results.json's provenance.machine: another CPU, vector instruction sets,
usable cores or GPUs) are marked `x` with the difference named, their figures shown but not judged: such a change
in speed says nothing about the code. Where a side's machine is unknown (a report written before it was recorded),
no difference is invented: a `+` or `-` stays, noting the machine is unknown.

Above each table, one line says where the two runs' code, host or machine differ (results.json's provenance:
another commit, uncommitted changes, another host or machine), or that a side's is unknown.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from common.results import Result, load_results_json
from harness.arguments import Parser
from harness.errors import UsageError
from harness.reporting import provenance
from harness.reporting.tables import milliseconds, table
from harness.reporting.trials import Trials, group

DESCRIPTION = (
    "Compare benchmark runs: per configuration, the change in images/s and step time, with a bootstrap "
    "interval of the step-time ratio over the trials and their steps; exit status 1 if a row got slower "
    "than --factor, significantly."
)
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


def parents() -> list[Parser]:
    p = Parser(add_help=False)
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="report directories or results.json files: the first is OLD, each other one is compared "
        "with it",
    )
    p.add_argument(
        "--factor",
        type=float,
        default=1.1,
        help="a row is slower (faster) when its median step time is more than FACTOR times OLD's "
        "(less than 1/FACTOR) and the test is significant (default 1.1)",
    )
    p.add_argument(
        "--alpha", type=float, default=0.05, help="significance level of the test (default 0.05)"
    )
    p.add_argument(
        "--accuracy-tolerance",
        type=float,
        default=0.01,
        metavar="ABS",
        help="flag a row whose final test accuracy moved by more than ABS (default 0.01)",
    )
    p.add_argument(
        "--accept",
        default="",
        metavar="WHAT",
        help="compare rows that differ in this anyway (comma list): versions (framework versions: "
        "an upgrade), devices (device kind and names: another machine); default: none",
    )
    return [p]


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
    return c.backend, c.variant, c.devices, c.nodes


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


def judge(
    old: Trials, new: Trials, args, accept: set[str], machines: tuple = (None, None)
) -> Verdict:
    """The row's verdict, `machines` the two runs' (provenance.machine; None where unknown)."""
    return across_machines(judge_figures(old, new, args, accept), *machines, accept)


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


def judge_figures(old: Trials, new: Trials, args, accept: set[str]) -> Verdict:
    """The row's verdict on its figures alone (which machine measured them aside)."""
    key = row_key(old)
    why = incomparable(old, new, accept)
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
        v.interval = ratio_interval(a, b, args.alpha)
        low, high = v.interval
        if low > 1 and v.ratio > args.factor:
            v.mark = SLOWER
        elif high < 1 and v.ratio < 1 / args.factor:
            v.mark = FASTER
        elif low > 1 or high < 1:
            notes.append(f"significant but within the factor {args.factor:g}")
    acc_old, acc_new = old.median("test_acc"), new.median("test_acc")
    if (
        acc_old is not None
        and acc_new is not None
        and abs(acc_new - acc_old) > args.accuracy_tolerance
    ):
        notes.append(
            f"accuracy drift {acc_old:.4f} -> {acc_new:.4f} (beyond {args.accuracy_tolerance:g})"
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
    old: list[Result], new: list[Result], args, machines: tuple = (None, None)
) -> list[Verdict]:
    """Every row's verdict; `machines` the two runs' (provenance.machine; None where unknown)."""
    accept = {w for w in args.accept.split(",") if w}
    olds = {row_key(t): t for t in group(old)}
    news = {row_key(t): t for t in group(new)}
    verdicts = [
        judge(olds[k], news[k], args, accept, machines)
        if k in news
        else Verdict(k, ONE_SIDE, note="only in OLD")
        for k in olds
    ]
    return verdicts + [Verdict(k, ONE_SIDE, note="only in NEW") for k in news if k not in olds]


# ------------------------------------------------------------------------ output


def change(old: float | None, new: float | None) -> str:
    return "—" if not old or new is None else f"{100 * (new / old - 1):+.1f}%"


def verdict_table(verdicts: list[Verdict]) -> list[str]:
    ms = milliseconds  # the report's: 2340, not 2.34e+03
    body = [
        [
            v.mark,
            v.key[0],
            v.key[1],
            f"{v.key[2]}" + (f" on {v.key[3]} nodes" if v.key[3] > 1 else ""),
            ms(v.old_step),
            ms(v.new_step),
            change(v.old_step, v.new_step),
            "—" if v.old_images is None else f"{v.old_images:.1f}",
            "—" if v.new_images is None else f"{v.new_images:.1f}",
            change(v.old_images, v.new_images),
            "—" if v.interval is None else f"{v.interval[0]:.3f}–{v.interval[1]:.3f}",
            f"{v.samples[0]} / {v.samples[1]}",
            v.note,
        ]
        for v in verdicts
    ]
    return table(
        [
            "",
            "backend",
            "strategy",
            "devices",
            "step ms OLD",
            "step ms NEW",
            "step",
            "images/s OLD",
            "images/s NEW",
            "images/s",
            "step ratio interval",
            "samples",
            "note",
        ],
        body,
    )


def check_args(args) -> None:
    if not (math.isfinite(args.factor) and args.factor >= 1):
        raise UsageError(f"--factor must be at least 1 (got {args.factor})")
    if not 0 < args.alpha < 1:
        raise UsageError(f"--alpha must be between 0 and 1 (got {args.alpha})")
    if not (math.isfinite(args.accuracy_tolerance) and args.accuracy_tolerance >= 0):
        raise UsageError(
            f"--accuracy-tolerance must be a non-negative number (got {args.accuracy_tolerance})"
        )
    unknown = {w for w in args.accept.split(",") if w} - set(ACCEPTABLE)
    if unknown:
        raise UsageError(
            f"--accept takes {' and/or '.join(ACCEPTABLE)} (got {','.join(sorted(unknown))})"
        )
    if len(args.runs) < 2:
        raise UsageError("compare needs at least two runs: OLD NEW")


def load(path: str) -> tuple[list[Result], dict]:
    """A run's results and its meta (provenance included, where recorded); bad input is a UsageError."""
    try:
        return load_results_json(path)
    except ValueError as e:
        raise UsageError(str(e)) from None


def machine_of(meta: dict) -> dict | None:
    """The machine a report's meta records (None: unknown)."""
    return provenance.machine_of(meta.get("provenance"))


def legend(args) -> str:
    return (
        f"Marks: {SLOWER} slower, {FASTER} faster (median step time beyond x{args.factor:g}, and the "
        f"bootstrap's {100 * (1 - args.alpha):g}% interval of the step-time ratio, over trials and their steps, "
        f"excludes 1), {NO_CHANGE} no significant change, {NOT_COMPARABLE} not comparable (another recipe, "
        "framework version, device, precision or machine: the note names it), "
        f"{ONE_SIDE} in one run only."
    )


def main(args) -> int:
    """`python -m harness compare`, its flags parsed (cli.build_parser)."""
    check_args(args)
    old, old_meta = load(args.runs[0])
    slower = []
    for path in args.runs[1:]:
        new, new_meta = load(path)
        machines = (machine_of(old_meta), machine_of(new_meta))
        verdicts = compare(old, new, args, machines)
        print(f"\n## {args.runs[0]} (OLD) -> {path} (NEW)\n")
        note = provenance.difference(old_meta.get("provenance"), new_meta.get("provenance"))
        if note:
            print(note + "\n")
        print("\n".join(verdict_table(verdicts)))
        slower += [(path, v) for v in verdicts if v.mark == SLOWER]
    print("\n" + legend(args))
    for path, v in slower:
        print(
            f"REGRESSION: {v.key[0]} {v.key[1]} on {devices_cell_key(v.key)}: step time "
            f"{change(v.old_step, v.new_step)} (interval {v.interval[0]:.3f}–{v.interval[1]:.3f}) in {path}"
        )
    return 1 if slower else 0


def devices_cell_key(key: tuple) -> str:
    return f"{key[2]} device(s)" + (f" on {key[3]} nodes" if key[3] > 1 else "")
