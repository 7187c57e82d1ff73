"""The report's Energy section: what each configuration's timed epochs cost, read from the devices' energy counters
at the timer's barriers (common/energy.py), with the scope of what was measured, or why nothing was."""

from __future__ import annotations

from common.energy import MIN_UPDATES
from harness.reporting.tables import Row, devices_cell, energy_median, energy_records, fmt, table

HEADER = [
    "backend",
    "strategy",
    "devices",
    "measured",
    "J/epoch",
    "images/J",
    "W in all",
    "W per counter",
    "J to target",
    "note",
]


def notes(records: list[dict]) -> str:
    """What changes how far the figure can be trusted: too few counter updates, a device held down."""
    said = []
    if any(r.get("short") for r in records):
        said.append(f"an epoch shorter than {MIN_UPDATES} counter updates")
    contexts = [r.get("context") or {} for r in records]
    gpus = [g for c in contexts for when in c.values() for g in when.get("gpus", [])]
    if any(g.get("throttled") for g in gpus):
        said.append("a GPU's clocks were held down (power cap, thermal or hardware slowdown)")
    return "; ".join(said) or "—"


def cells(row: Row) -> list[str]:
    c = row.result.config
    records = energy_records(row)
    first = records[0]
    return [
        c.backend,
        c.variant,
        devices_cell(c),
        f"{first['scope']}, {first['counters']} counter(s) in {first['processes']} process(es)",
        fmt(energy_median(row, "joules_per_epoch"), ".4g"),
        fmt(energy_median(row, "images_per_joule"), ".4g"),
        fmt(energy_median(row, "average_w"), ".4g"),
        fmt(energy_median(row, "per_counter_w"), ".4g"),
        fmt(energy_median(row, "to_target_j"), ".4g"),
        notes(records),
    ]


def unmeasured(rows: list[Row]) -> list[str]:
    """One line per reason no energy was measured, naming the configurations it held for."""
    reasons: dict[str, list[str]] = {}
    for row in rows:
        r = row.result
        if r.ok and r.energy and not r.energy.get("measured"):
            reasons.setdefault(r.energy.get("why") or "no reason given", []).append(
                f"{r.config.backend} {r.config.variant} x{r.config.devices}"
            )
    return [f"- {', '.join(which)}: energy not measured: {why}." for why, which in reasons.items()]


def energy_section(rows: list[Row], plotted: bool = False) -> list[str]:
    """The Energy section; nothing for a report whose runs predate the record."""
    if not any(row.result.ok and row.result.energy for row in rows):
        return []
    body = [cells(row) for row in rows if row.result.ok and energy_records(row)]
    lines = ["## Energy", ""]
    if body:
        lines += table(HEADER, body) + [""]
    lines += unmeasured(rows)
    lines += [
        "",
        "Energy of the timed epochs only, read from the hardware's own counters at the same device barriers that "
        "bound each epoch's time (docs/energy.md): on a GPU the board's NVML energy counter, on a CPU the "
        "packages' RAPL counters (the whole host's packages, whatever the run used), never wall power and never "
        "an estimate. Each host's counters are read by one process and summed over the hosts. J/epoch: the mean "
        "epoch; images/J: the epochs' images over their joules; W: joules over the epochs' seconds, in all and "
        f"per counter (a GPU, or a CPU package). MLPerf's power rules ask for at least {MIN_UPDATES} samples "
        "over the measured interval: an epoch shorter than that many counter updates is noted.",
        "",
    ]
    if plotted:
        lines += ["![Energy and accuracy](energy.png)", ""]
    return lines
