"""`python -m harness compare OLD NEW [NEW ...]`: did a run get slower or faster than another, beyond noise?

Each NEW is compared with OLD, row by row: a row is a configuration (backend, strategy with its options and
levers, devices, nodes), its figures the medians over its kept trials (harness/trials.py). The test is
Mann-Whitney U (two-sided, normal approximation with tie and continuity corrections, as asv and scipy's
"asymptotic" method) on the step-time samples: every timed step of every kept trial. A row is marked, as asv
does, `-` (slower) when its median step time grew by more than --factor and the test says p < --alpha, `+`
(faster) for the mirror case, `~` otherwise. The exit status is 1 if any row is slower, 2 on bad input.

Rows are compared only where the comparison means something: the same initial weights and batch sequence
(hashes), the same training recipe (the config fields of COMPARABLE), framework versions, device kind and
effective precision. Other rows are flagged with the reason, not compared; `--accept versions` (a framework
upgrade) or `--accept devices` (another machine) compares across what the user means to change.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from common.results import Result, load_results_json
from harness.arguments import Parser, UsageError
from harness.tables import table
from harness.trials import Trials, group

DESCRIPTION = ("Compare benchmark runs: per configuration, the change in images/s and step time with a Mann-Whitney "
               "U test on the step-time samples; exit status 1 if a row got slower than --factor, significantly.")
# The config fields a run's figures depend on besides the row's own key: a difference makes rows incomparable.
COMPARABLE = ("model", "batch_size", "lr", "epochs", "train_size", "test_size", "eval_batch_size", "dataset", "bn",
              "init", "seed", "timed_steps", "simulated")
ACCEPTABLE = ("versions", "devices")
MIN_SAMPLES = 3     # per side: below this a rank test cannot reach any usual significance level


def parents() -> list[Parser]:
    p = Parser(add_help=False)
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="report directories or results.json files: the first is OLD, each other one is compared "
                        "with it")
    p.add_argument("--factor", type=float, default=1.1,
                   help="a row is slower (faster) when its median step time is more than FACTOR times OLD's "
                        "(less than 1/FACTOR) and the test is significant (default 1.1)")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level of the test (default 0.05)")
    p.add_argument("--accuracy-tolerance", type=float, default=0.01, metavar="ABS",
                   help="flag a row whose final test accuracy moved by more than ABS (default 0.01)")
    p.add_argument("--accept", default="", metavar="WHAT",
                   help="compare rows that differ in this anyway (comma list): versions (framework versions: "
                        "an upgrade), devices (device kind and names: another machine); default: none")
    return [p]


# ------------------------------------------------------------------------ the test

def mann_whitney_u(a: list[float], b: list[float]) -> tuple[float, float]:
    """(U of `a`, two-sided p): the normal approximation with the tie correction and a continuity correction
    (scipy.stats.mannwhitneyu(a, b, method="asymptotic"))."""
    n1, n2 = len(a), len(b)
    pooled = sorted([(v, 0) for v in a] + [(v, 1) for v in b])
    ranks, ties, i = [0.0] * len(pooled), 0.0, 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1            # ties share the mean of their ranks
        t = j - i + 1
        ties += t ** 3 - t
        i = j + 1
    u = sum(rank for rank, (_, side) in zip(ranks, pooled) if side == 0) - n1 * (n1 + 1) / 2
    n = n1 + n2
    variance = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if variance <= 0:                               # every value equal: no evidence of a difference
        return u, 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(variance)
    return u, min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


# ------------------------------------------------------------------------ rows

def row_key(t: Trials) -> tuple:
    c = t.config
    return c.backend, c.variant, c.devices, c.nodes


def incomparable(old: Trials, new: Trials, accept: set[str]) -> list[str]:
    """Why the two rows' figures do not measure the same thing ([] if they do)."""
    a, b = old.representative(), new.representative()
    why = [f"{name} {getattr(a.config, name)} vs {getattr(b.config, name)}" for name in COMPARABLE
           if getattr(a.config, name) != getattr(b.config, name)]
    for name, label in (("weights_hash", "initial weights"), ("data_hash", "batch sequence")):
        if getattr(a, name) and getattr(b, name) and getattr(a, name) != getattr(b, name):
            why.append(f"{label} hash {getattr(a, name)[:12]} vs {getattr(b, name)[:12]}")
    ea, eb = a.environment, b.environment
    if "versions" not in accept and ea.get("framework_version") != eb.get("framework_version"):
        why.append(f"{ea.get('framework', 'framework')} {ea.get('framework_version')} vs "
                   f"{eb.get('framework_version')}")
    if "devices" not in accept and (a.config.device_kind, ea.get("devices")) != (b.config.device_kind,
                                                                                  eb.get("devices")):
        why.append(f"devices {a.config.device_kind} {ea.get('devices')} vs {b.config.device_kind} {eb.get('devices')}")
    if (ea.get("precision") or {}).get("mode") != (eb.get("precision") or {}).get("mode"):
        why.append(f"precision {(ea.get('precision') or {}).get('mode')} vs {(eb.get('precision') or {}).get('mode')}")
    return why


@dataclass
class Verdict:
    key: tuple
    mark: str                   # "-" slower, "+" faster, "~" no significant change, "!" not compared, "?" one side
    old_step: float | None = None
    new_step: float | None = None
    old_images: float | None = None
    new_images: float | None = None
    p: float | None = None
    samples: tuple[int, int] = (0, 0)
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return self.new_step / self.old_step if self.old_step and self.new_step else None


def judge(old: Trials, new: Trials, args, accept: set[str]) -> Verdict:
    key = row_key(old)
    why = incomparable(old, new, accept)
    if why:
        return Verdict(key, "!", note="not comparable: " + "; ".join(why))
    a, b = old.step_samples(), new.step_samples()
    v = Verdict(key, "~", old_images=old.median("images_per_s"), new_images=new.median("images_per_s"),
                samples=(len(a), len(b)))
    if not a or not b:
        v.note = "no step times to compare"
        return v
    v.old_step, v.new_step = statistics.median(a), statistics.median(b)
    notes = []
    if min(len(a), len(b)) < MIN_SAMPLES:
        notes.append(f"too few samples for the test ({len(a)} and {len(b)})")
    else:
        v.p = mann_whitney_u(a, b)[1]
        if v.p < args.alpha and v.ratio > args.factor:
            v.mark = "-"
        elif v.p < args.alpha and v.ratio < 1 / args.factor:
            v.mark = "+"
        elif v.p < args.alpha:
            notes.append(f"significant but within the factor {args.factor:g}")
    acc_old, acc_new = old.median("test_acc"), new.median("test_acc")
    if acc_old is not None and acc_new is not None and abs(acc_new - acc_old) > args.accuracy_tolerance:
        notes.append(f"accuracy drift {acc_old:.4f} -> {acc_new:.4f} (beyond {args.accuracy_tolerance:g})")
    v.note = "; ".join(notes)
    return v


def compare(old: list[Result], new: list[Result], args) -> list[Verdict]:
    accept = {w for w in args.accept.split(",") if w}
    olds = {row_key(t): t for t in group(old)}
    news = {row_key(t): t for t in group(new)}
    verdicts = [judge(olds[k], news[k], args, accept) if k in news else Verdict(k, "?", note="only in OLD")
                for k in olds]
    return verdicts + [Verdict(k, "?", note="only in NEW") for k in news if k not in olds]


# ------------------------------------------------------------------------ output

def change(old: float | None, new: float | None) -> str:
    return "—" if not old or new is None else f"{100 * (new / old - 1):+.1f}%"


def verdict_table(verdicts: list[Verdict]) -> list[str]:
    ms = lambda s: "—" if s is None else f"{1e3 * s:.3g}"
    body = [[v.mark, v.key[0], v.key[1], f"{v.key[2]}" + (f" on {v.key[3]} nodes" if v.key[3] > 1 else ""),
             ms(v.old_step), ms(v.new_step), change(v.old_step, v.new_step),
             "—" if v.old_images is None else f"{v.old_images:.1f}",
             "—" if v.new_images is None else f"{v.new_images:.1f}", change(v.old_images, v.new_images),
             "—" if v.p is None else f"{v.p:.3g}", f"{v.samples[0]} / {v.samples[1]}", v.note]
            for v in verdicts]
    return table(["", "backend", "strategy", "devices", "step ms OLD", "step ms NEW", "step", "images/s OLD",
                  "images/s NEW", "images/s", "p (Mann-Whitney U)", "samples", "note"], body)


def check_args(args) -> None:
    if not (math.isfinite(args.factor) and args.factor >= 1):
        raise UsageError(f"--factor must be at least 1 (got {args.factor})")
    if not 0 < args.alpha < 1:
        raise UsageError(f"--alpha must be between 0 and 1 (got {args.alpha})")
    if not (math.isfinite(args.accuracy_tolerance) and args.accuracy_tolerance >= 0):
        raise UsageError(f"--accuracy-tolerance must be a non-negative number (got {args.accuracy_tolerance})")
    unknown = {w for w in args.accept.split(",") if w} - set(ACCEPTABLE)
    if unknown:
        raise UsageError(f"--accept takes {' and/or '.join(ACCEPTABLE)} (got {','.join(sorted(unknown))})")
    if len(args.runs) < 2:
        raise UsageError("compare needs at least two runs: OLD NEW")


def load(path: str) -> list[Result]:
    try:
        return load_results_json(path)[0]
    except ValueError as e:
        raise UsageError(str(e)) from None


def main(args) -> int:
    """`python -m harness compare`, its flags parsed (cli.build_parser)."""
    check_args(args)
    old = load(args.runs[0])
    slower = []
    for path in args.runs[1:]:
        verdicts = compare(old, load(path), args)
        print(f"\n## {args.runs[0]} (OLD) -> {path} (NEW)\n")
        print("\n".join(verdict_table(verdicts)))
        slower += [(path, v) for v in verdicts if v.mark == "-"]
    print(f"\nMarks: - slower, + faster (median step time beyond x{args.factor:g} and p < {args.alpha:g}), "
          "~ no significant change, ! not compared, ? in one run only.")
    for path, v in slower:
        print(f"REGRESSION: {v.key[0]} {v.key[1]} on {devices_cell_key(v.key)}: step time "
              f"{change(v.old_step, v.new_step)} (p = {v.p:.3g}) in {path}")
    return 1 if slower else 0


def devices_cell_key(key: tuple) -> str:
    return f"{key[2]} device(s)" + (f" on {key[3]} nodes" if key[3] > 1 else "")
