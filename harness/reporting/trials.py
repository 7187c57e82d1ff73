"""Repeated trials (`--repeat K`): the runs of one configuration, which of them count, and their figures.

A trial is one fresh worker process. Trials that did not finish (failed, timed out, diverged, ...) are dropped
with their status; of five or more finished trials the fastest and the slowest (by images/s) are dropped too, as
MLPerf Training scores a benchmark. The figures of a configuration are the medians over the trials kept, the
spread their range, and its step-time samples every timed step of every kept trial.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass

from common.results import Result

MLPERF_MIN_TRIALS = 5  # from this many finished trials on, the fastest and the slowest are dropped


@dataclass
class Trials:
    """Every trial of one configuration, in the order they ran."""

    runs: list[Result]
    kept: list[Result]
    dropped: list[tuple[Result, str]]  # with the reason

    @property
    def config(self):
        return self.runs[0].config

    def median(self, figure: str) -> float | None:
        """The median over the kept trials of one of Result.summary()'s figures."""
        values = [r.summary().get(figure) for r in self.kept]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    def spread(self, figure: str) -> tuple[float, float] | None:
        values = [v for v in (r.summary().get(figure) for r in self.kept) if v is not None]
        return (min(values), max(values)) if values else None

    def step_samples(self, by_trial: bool = False) -> list:
        """Every timed step of the kept trials, in seconds, pooled (or one list per trial). A trial written before
        the samples were kept gives its median step."""
        trials = []
        for r in self.kept:
            if r.step_time and r.step_time.samples_s:
                trials.append(list(r.step_time.samples_s))
            elif r.step_time and r.step_time.median_s is not None:
                trials.append([r.step_time.median_s])
        return trials if by_trial else [s for t in trials for s in t]

    def representative(self) -> Result:
        """The kept trial whose images/s is nearest the median (its warm-up, memory and epochs stand for the
        configuration's), else the first trial."""
        middle = self.median("images_per_s")
        if middle is None:
            return self.kept[0] if self.kept else self.runs[0]
        return min(self.kept, key=lambda r: abs((r.summary().get("images_per_s") or 0.0) - middle))


# Config fields in which the trials of one configuration may differ: what a run does after everything timed
# (common/loop.py; the first trial of a backend measures its matmul peak, parity profiles its first), and the batch
# order of a time-to-accuracy trial (harness/planning/plan.py trial_config).
AFTER_TIMING = ("profile", "measure_peak")
TRIAL_FIELDS = (*AFTER_TIMING, "order_seed")


def identity(r: Result) -> str:
    """What makes two runs trials of one configuration: the same config, every field but TRIAL_FIELDS'."""
    config = {k: v for k, v in r.config.to_dict().items() if k not in TRIAL_FIELDS}
    return json.dumps(config, sort_keys=True)


def keep(runs: list[Result]) -> tuple[list[Result], list[tuple[Result, str]]]:
    """The trials that count, and the dropped ones with the reason."""
    finished = [r for r in runs if r.ok]
    dropped = [(r, r.status) for r in runs if not r.ok]
    timed = [
        r for r in finished if r.summary().get("images_per_s")
    ]  # (evaluation-only runs time nothing)
    if len(timed) >= MLPERF_MIN_TRIALS:
        by_speed = sorted(timed, key=lambda r: r.summary()["images_per_s"])
        slowest, fastest = by_speed[0], by_speed[-1]
        dropped += [
            (slowest, "the slowest of the finished trials (MLPerf's rule)"),
            (fastest, "the fastest of the finished trials (MLPerf's rule)"),
        ]
        finished = [r for r in finished if r is not slowest and r is not fastest]
    return finished, dropped


def group(results: list[Result]) -> list[Trials]:
    """The results grouped by configuration, in the order each configuration first ran."""
    groups: dict[str, list[Result]] = {}
    for r in results:
        groups.setdefault(identity(r), []).append(r)
    return [Trials(runs, *keep(runs)) for runs in groups.values()]
