"""The report's Step time and communication table, and whether a run's figures agree: each configuration's timed
steps (their median and p10-p90, pooled over its kept trials), its allreduce figure, and its epochs over its steps at
the median step time, in bold outside CONSISTENCY_LOW to CONSISTENCY_LIMIT (common/results.py), with a note for each
configuration whose figures disagree or whose framework compiled inside its timed epochs."""

from __future__ import annotations

import statistics

from common.results import CONSISTENCY_LIMIT, CONSISTENCY_LOW
from harness.reporting.tables import (
    Row,
    devices_cell,
    epoch_over_steps,
    fmt,
    milliseconds,
    table,
)


def step_statistics(row: Row) -> tuple[float, float, float, int]:
    """(median, p10, p90, steps) of the row's timed steps: its run's, or with several trials every kept
    trial's steps together."""
    step = row.result.step_time
    samples = row.trials.step_samples() if row.repeated else []
    if len(samples) < 2:
        return step.median_s, step.p10_s, step.p90_s, step.steps
    deciles = statistics.quantiles(samples, n=10, method="inclusive")
    return statistics.median(samples), deciles[0], deciles[-1], len(samples)


def steps_table(rows: list[Row]) -> list[str]:
    """Step statistics and the communication figure of every run that has them."""
    body = []
    for row in rows:
        r = row.result
        step, ar = r.step_time, r.allreduce
        if not r.ok or not step:
            continue
        c = r.config
        ms = milliseconds
        several = c.devices > 1  # on one device there is nothing to send: no bandwidth to speak of
        median, p10, p90, steps = step_statistics(row)
        body.append(
            [
                c.backend,
                c.variant,
                devices_cell(c, simulated=False),
                f"{ms(median)}",
                f"{ms(p10)}–{ms(p90)}",
                str(steps),
                fmt(c.batch_size / median if median else None, ".1f"),
                fmt(ar and ar.bytes / 1e6, ".1f"),
                ms(ar and ar.median_s),
                fmt(ar.gb_per_s if ar and several else None, ".2f"),
                fmt(ar and ar.share_of_step, ".0%"),
                consistency_cell(epoch_over_steps(row, median)),
            ]
        )
    if not body:
        return []
    return table(
        [
            "backend",
            "strategy",
            "devices",
            "step ms (median)",
            "p10–p90 ms",
            "steps",
            "images/s at median",
            "gradients MB / step",
            "allreduce ms",
            "allreduce GB/s",
            "allreduce / step",
            "epoch / steps",
        ],
        body,
    )


def consistent(ratio: float | None) -> bool:
    """Whether a run's epochs are its steps at the median step time, within CONSISTENCY_LOW to CONSISTENCY_LIMIT
    (or not known); judged at the two decimals the report shows, so that a 0.85 it prints is not flagged."""
    return ratio is None or CONSISTENCY_LOW <= round(ratio, 2) <= CONSISTENCY_LIMIT


def consistency_cell(ratio: float | None) -> str:
    """The ratio, in bold outside the limits."""
    if ratio is None:
        return "—"
    return f"{ratio:.2f}" if consistent(ratio) else f"**{ratio:.2f}**"


def consistency_notes(rows: list[Row]) -> list[str]:
    """A line for each configuration whose figures disagree: its epochs took more than CONSISTENCY_LIMIT or less
    than CONSISTENCY_LOW times its steps at the median step time, or its framework compiled inside a timed epoch;
    [] if none."""
    notes = []
    for row in rows:
        r = row.result
        runs = row.trials.runs if row.trials else [r]
        compiled = sum((run.compiles or {}).get("epochs", 0) for run in runs if run.ok)
        ratio = epoch_over_steps(row, step_statistics(row)[0]) if r.ok and r.step_time else None
        said = [] if consistent(ratio) else [ratio_words(ratio)]
        if compiled:
            said.append(
                f"the framework compiled {compiled} program(s) inside the timed epochs"
                f"{' of its trials' if len(runs) > 1 else ''}"
            )
        if said:
            notes.append(
                f"- **{r.config.backend} {r.config.variant}** on {devices_cell(r.config)}: "
                + "; ".join(said)
            )
    return notes


def ratio_words(ratio: float) -> str:
    """What an epoch / steps ratio outside the limits says."""
    figure = f"its s/epoch is {ratio:.2f}x its steps at the median step time"
    if ratio > CONSISTENCY_LIMIT:
        return (
            f"{figure} (limit {CONSISTENCY_LIMIT:g}): something inside the timed epochs is not in a step "
            "timed alone"
        )
    return (
        f"{figure} (below {CONSISTENCY_LOW:g}): its epochs overlap what each timed step, between two "
        "barriers, pays alone"
    )
