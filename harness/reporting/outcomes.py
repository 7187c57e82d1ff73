"""How the runs came out, run by run, as the report lists them: each configuration's test accuracy per epoch; with
--repeat, every trial with its figures and whether it counts; and every run that failed or did not run, grouped by
its reason, with the epochs it finished before it failed."""

from __future__ import annotations

from common.results import Result
from harness.reporting.tables import Row, devices_cell, fmt, key, milliseconds, table


def accuracy_table(rows: list[Row]) -> list[str]:
    ok = [row.result for row in rows if row.result.ok and row.result.epochs]
    if not ok:
        return []
    n = max(len(r.epochs) for r in ok)
    body = [
        [
            " ".join(map(str, key(r)[:3]))
            + (f" on {r.config.nodes.count} nodes" if r.config.nodes.count > 1 else "")
        ]
        + [fmt(e.test_acc, ".4f") for e in r.epochs]
        + [""] * (n - len(r.epochs))
        for r in ok
    ]
    return table(["run"] + [f"epoch {i + 1}" for i in range(n)], body)


def trials_table(rows: list[Row]) -> list[str]:
    """With --repeat: every trial of every configuration, its figures, and whether it counts (and why not)."""
    if not any(row.repeated for row in rows):
        return []
    body = []
    for row in rows:
        dropped = {id(r): why for r, why in row.trials.dropped}
        for r in row.trials.runs:
            c, s = r.config, r.summary() if r.ok else {}
            body.append(
                [
                    c.backend,
                    c.variant,
                    devices_cell(c),
                    str(r.trial or 1),
                    fmt(s.get("images_per_s"), ".1f"),
                    milliseconds(r.step_time and r.step_time.median_s),
                    fmt(s.get("test_acc"), ".4f"),
                    "dropped: " + dropped[id(r)] if id(r) in dropped else "kept",
                ]
            )
    return table(
        [
            "backend",
            "strategy",
            "devices",
            "trial",
            "images/s",
            "step ms (median)",
            "test acc",
            "counts",
        ],
        body,
    )


STATUS_NOTE = {
    "failed": "failed",
    "timeout": "timed out",
    "diverged": "diverged",
    "unavailable": "not run",
    "interrupted": "interrupted",
}


def failures(rows: list[Row]) -> list[str]:
    """One entry per (backend, strategy, status, reason), naming the device counts (and trials) it covers."""
    groups: dict[tuple, list[Result]] = {}
    for row in rows:
        for r in row.trials.runs if row.trials else [row.result]:
            if not r.ok:
                reason = (r.error or "no reason recorded").strip()
                groups.setdefault((*key(r)[:2], r.status, reason), []).append(r)
    lines = []
    for (backend, strategy, status, reason), runs in groups.items():
        counts = ", ".join(dict.fromkeys(str(r.config.devices) for r in runs)) + " device(s)"
        if any(r.trial for r in runs):
            counts += ", trial " + ", ".join(str(r.trial) for r in runs)
        logs = ", ".join(f"`{r.log}`" for r in runs if r.log)
        lines.append(
            f"- **{backend} {strategy}**, {counts}: {STATUS_NOTE.get(status, status)} — "
            f"{reason.splitlines()[-1]}" + (f" (log: {logs})" if logs else "")
        )
        lines += partial_lines(runs)
        if status in ("failed", "timeout", "diverged") and len(reason.splitlines()) > 1:
            lines += ["", "  ```", *["  " + l for l in reason.splitlines()[-12:]], "  ```"]
    return lines


def partial_lines(runs: list[Result]) -> list[str]:
    """The epochs a run finished before it failed (results.json's `partial_epochs`, from its progress lines):
    measured, so shown, and partial, so in no row's figures."""
    lines = []
    for r in runs:
        epochs = r.extra.get("partial_epochs")
        if not isinstance(epochs, list) or not epochs:
            continue
        done = "; ".join(
            f"epoch {e['epoch']}: {e['time_s']:.2f} s, {e['images_per_s']:.1f} images/s, test acc "
            f"{e['test_acc']:.4f}"
            for e in epochs
            if isinstance(e, dict) and all(isinstance(e.get(k), int | float) for k in PARTIAL_SHOWN)
        )
        if done:
            lines.append(f"  - partial, before it failed ({r.config.devices} device(s)): {done}")
    return lines


PARTIAL_SHOWN = ("epoch", "time_s", "images_per_s", "test_acc")
