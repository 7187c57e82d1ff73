"""The report's numbers and tables: summary numbers per run, speed-up against the 1-device run, Markdown tables."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from common import manifest
from common.results import Result

STATUS_NOTE = {
    "failed": "failed", "timeout": "timed out", "diverged": "diverged",
    "unavailable": "not run", "interrupted": "interrupted",
}


def as_results(results: list[dict | Result]) -> list[Result]:
    """The report reads Results; the harness hands it result dicts: converted here, once, where they enter."""
    return [r if isinstance(r, Result) else Result.from_dict(r) for r in results]


def key(r: Result) -> tuple:
    c = r.config
    return c.backend, c.variant, c.devices, c.nodes


def devices_cell(c, simulated: bool = True) -> str:
    """"2 (sim.)", or with several nodes "4 = 2 nodes x 2 (sim.)": how the devices were spread."""
    spread = f" = {c.nodes} nodes x {c.local_devices}" if c.nodes > 1 else ""
    return f"{c.devices}{spread}{' (sim.)' if c.simulated and simulated else ''}"


@dataclass
class Row:
    """One run with its summary numbers; speed-up and efficiency against the 1-device run of its variant."""
    result: Result
    sec_per_epoch: float | None = None
    images_per_s: float | None = None
    test_acc: float | None = None
    train_loss: float | None = None
    speedup: float | None = None
    efficiency: float | None = None


def baseline(r: Result) -> tuple:
    """The runs compared in speed-up: the same backend and strategy, options and levers, except an option
    at its several-node default (MXNet's dist_sync kvstore is measured against its 1-device run)."""
    c = r.config
    options = c.options
    if c.nodes > 1 and manifest.canonical_name(c.backend):
        declared = manifest.load(c.backend).options
        options = {k: v for k, v in options.items() if k not in declared or v != declared[k].nodes_default}
    return c.backend, dataclasses.replace(c, options=options).variant


def with_scaling(results: list[Result]) -> list[Row]:
    """Attach summary numbers, speed-up and efficiency against the 1-device run of the same backend/strategy."""
    rows = []
    base = {}
    for r in results:
        s = r.summary() if r.ok else {}
        if s.get("images_per_s") and r.config.devices == 1 and r.config.nodes == 1:
            base[baseline(r)] = s["images_per_s"]
    for r in results:
        s = r.summary() if r.ok else {}
        b = base.get(baseline(r))
        if s.get("images_per_s") and b:
            s["speedup"] = s["images_per_s"] / b
            s["efficiency"] = s["speedup"] / r.config.devices
        rows.append(Row(r, **s))
    rows.sort(key=lambda row: key(row.result))
    return rows


def fmt(value, spec: str, missing: str = "—") -> str:
    return missing if value is None else format(value, spec)


def table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return lines


def peak_memory(r: Result) -> str:
    """Peak device memory where the framework exposes it, else the worker's peak host RSS."""
    memory = r.memory
    if memory and memory.peak_device_mb is not None:
        return f"{memory.peak_device_mb:.0f}"
    if memory and memory.peak_host_rss_mb is not None:
        return f"{memory.peak_host_rss_mb:.0f} (host RSS)"
    return "—"


def summary_table(rows: list[Row]) -> list[str]:
    body = []
    for row in rows:
        r = row.result
        if not r.ok:
            continue
        c = r.config
        body.append([
            c.backend, c.variant, devices_cell(c),
            str(c.batch_size), f"{c.lr:g}",
            fmt(row.sec_per_epoch, ".2f"), fmt(row.images_per_s, ".1f"),
            fmt(row.speedup, ".2f"), fmt(row.efficiency, ".0%"),
            fmt(row.test_acc, ".4f"), fmt(r.compile_s, ".2f"),
            peak_memory(r), fmt(r.params, ","),
        ])
    header = ["backend", "strategy", "devices", "batch", "lr", "s/epoch", "images/s", "speed-up",
              "efficiency", "test acc", "warm-up s", "peak mem MB", "params"]
    return table(header, body) if body else ["No run finished successfully."]


def milliseconds(seconds: float | None) -> str:
    """Three significant digits without exponents: 1084, 35.8, 4.50, 0.00039."""
    if seconds is None:
        return "—"
    ms = 1e3 * seconds
    if ms >= 100:
        return f"{ms:.0f}"
    return f"{ms:.3g}" if ms >= 1 else f"{ms:.2g}"


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
        several = c.devices > 1     # on one device there is nothing to send: no bandwidth to speak of
        body.append([c.backend, c.variant, devices_cell(c, simulated=False), f"{ms(step.median_s)}",
                     f"{ms(step.p10_s)}–{ms(step.p90_s)}", str(step.steps),
                     fmt(step.images_per_s, ".1f"),
                     ms(ar and ar.median_s), fmt(ar.gb_per_s if ar and several else None, ".2f"),
                     fmt(ar and ar.share_of_step, ".0%")])
    if not body:
        return []
    mb = next(row.result.allreduce.bytes for row in rows if row.result.ok and row.result.allreduce) / 1e6
    return table(["backend", "strategy", "devices", "step ms (median)", "p10–p90 ms", "steps", "images/s at median",
                  f"allreduce ms ({mb:.1f} MB)", "allreduce GB/s", "allreduce / step"], body)


def accuracy_table(rows: list[Row]) -> list[str]:
    ok = [row.result for row in rows if row.result.ok and row.result.epochs]
    if not ok:
        return []
    n = max(len(r.epochs) for r in ok)
    body = [[" ".join(map(str, key(r)[:3])) + (f" on {r.config.nodes} nodes" if r.config.nodes > 1 else "")]
            + [fmt(e.test_acc, ".4f") for e in r.epochs]
            + [""] * (n - len(r.epochs)) for r in ok]
    return table(["run"] + [f"epoch {i + 1}" for i in range(n)], body)


def failures(rows: list[Row]) -> list[str]:
    """One entry per (backend, strategy, status, reason), naming the device counts it covers."""
    groups: dict[tuple, list[Result]] = {}
    for row in rows:
        r = row.result
        if not r.ok:
            reason = (r.error or "no reason recorded").strip()
            groups.setdefault((*key(r)[:2], r.status, reason), []).append(r)
    lines = []
    for (backend, strategy, status, reason), runs in groups.items():
        counts = ", ".join(str(r.config.devices) for r in runs)
        logs = ", ".join(f"`{r.log}`" for r in runs if r.log)
        lines.append(f"- **{backend} {strategy}**, {counts} device(s): {STATUS_NOTE.get(status, status)} — "
                     f"{reason.splitlines()[-1]}" + (f" (log: {logs})" if logs else ""))
        if status in ("failed", "timeout", "diverged") and len(reason.splitlines()) > 1:
            lines += ["", "  ```", *["  " + l for l in reason.splitlines()[-12:]], "  ```"]
    return lines
