"""The report's numbers and tables: one row per configuration with its summary numbers, speed-up against the
1-device run, the summary table and its records, and the Markdown helpers every table uses. The step time table is
steps.py's; the run-by-run listings (accuracy per epoch, trials, failures) are outcomes.py's."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from common import manifest
from common.profiling import step_seconds
from common.results import Result, device_busy
from common.results import epoch_over_steps as epoch_over_steps_of
from harness.reporting import flops
from harness.reporting.trials import Trials, group


def as_results(results: list[dict | Result]) -> list[Result]:
    """The report reads Results; the harness hands it result dicts: converted here, once, where they enter."""
    return [r if isinstance(r, Result) else Result.from_dict(r) for r in results]


def key(r: Result) -> tuple:
    c = r.config
    return c.backend, c.variant, c.devices, c.nodes.count


def devices_cell(c, simulated: bool = True) -> str:
    """ "2 (sim.)", or with several nodes "4 = 2 nodes x 2 (sim.)": how the devices were spread."""
    spread = f" = {c.nodes.count} nodes x {c.local_devices}" if c.nodes.count > 1 else ""
    return f"{c.devices}{spread}{' (sim.)' if c.simulated and simulated else ''}"


@dataclass
class Row:
    """One configuration with its summary numbers (the medians over its kept trials; with one trial, that run's)
    and speed-up and efficiency against the 1-device row of its variant. `result` is the representative trial."""

    result: Result
    sec_per_epoch: float | None = None
    images_per_s: float | None = None
    test_acc: float | None = None
    train_loss: float | None = None
    speedup: float | None = None
    efficiency: float | None = None
    trials: Trials | None = None
    # the framework's measured matmul peak on this host at the run's precision (TFLOP/s), from the run of the
    # report that measured it (measured_peaks)
    matmul_peak: float | None = None

    @property
    def repeated(self) -> bool:
        return self.trials is not None and len(self.trials.runs) > 1

    @property
    def profile(self) -> dict | None:
        """The configuration's --profile record: its first profiled trial's, which need not be the representative
        one (parity profiles only each side's first trial)."""
        runs = self.trials.runs if self.trials else [self.result]
        return next((r.profile for r in runs if r.ok and r.profile), None)

    @property
    def timed_step_s(self) -> float | None:
        step = self.result.step_time
        return step and step.median_s

    @property
    def profile_seconds(self) -> dict[str, float]:
        """Its breakdown's seconds per step and category, as the report compares them (on a GPU, the device's
        idle time is the timed step's: common/profiling.py step_seconds)."""
        return step_seconds(self.profile or {}, self.timed_step_s)

    @property
    def device_busy(self) -> float | None:
        """The share of the row's epoch step (its s/epoch over the steps of an epoch) its kernels fill, with a
        device trace (common/results.py device_busy)."""
        epochs = self.result.epochs
        if not self.sec_per_epoch or not epochs:
            return None
        return device_busy([self.sec_per_epoch], epochs[0].steps, self.profile)


def baseline(r: Result) -> tuple:
    """The runs compared in speed-up: the same backend and strategy, options and levers, except an option
    at its several-node default (MXNet's dist_sync kvstore is measured against its 1-device run)."""
    c = r.config
    options = c.options
    if c.nodes.count > 1 and manifest.canonical_name(c.backend):
        declared = manifest.load(c.backend).options
        options = {
            k: v for k, v in options.items() if k not in declared or v != declared[k].nodes_default
        }
    return c.backend, dataclasses.replace(c, options=options).variant


def with_scaling(results: list[Result]) -> list[Row]:
    """One row per configuration (its trials grouped: trials.py), with summary numbers, and speed-up and
    efficiency against the 1-device row of the same backend/strategy."""
    rows = []
    for t in group(results):
        figures = {
            name: t.median(name)
            for name in ("sec_per_epoch", "images_per_s", "test_acc", "train_loss")
        }
        rows.append(
            Row(t.representative(), **{k: v for k, v in figures.items() if v is not None}, trials=t)
        )
    base = {
        baseline(row.result): row.images_per_s
        for row in rows
        if row.images_per_s
        and row.result.config.devices == 1
        and row.result.config.nodes.count == 1
    }
    peaks = measured_peaks(results)
    for row in rows:
        b = base.get(baseline(row.result))
        if row.images_per_s and b:
            row.speedup = row.images_per_s / b
            row.efficiency = row.speedup / row.result.config.devices
        c = row.result.config
        row.matmul_peak = peaks.get((c.backend, c.device_kind, peak_dtype(c.levers.precision)))
    rows.sort(key=lambda row: key(row.result))
    return rows


def peak_dtype(precision: str) -> str:
    """The dtype of the matmul peak a run at `precision` is held to (TF32 has no peak measured: float32's)."""
    return "bfloat16" if precision == "bf16" else "float32"


def measured_peaks(results: list[Result]) -> dict[tuple, float]:
    """{(backend, device kind, dtype): TFLOP/s}: the matmul peaks the report's runs measured (one run per
    backend measures them: common/loop.py measured_peak)."""
    peaks = {}
    for r in results:
        for dtype, tflops in ((r.peak or {}).get("tflops") or {}).items():
            if tflops:
                peaks[(r.config.backend, r.config.device_kind, dtype)] = tflops
    return peaks


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


def params_cell(r: Result) -> str:
    """The model's parameters; a sharded strategy's (fsdp) with the MiB one device holds of them."""
    held = r.memory.parameters_mb if r.memory else None
    if held is None:
        return fmt(r.params, ",")
    return f"{fmt(r.params, ',')} ({held:.3g} MiB a device)"


def images_cell(row: Row) -> str:
    """images/s; with several trials the median and the kept trials' range."""
    cell = fmt(row.images_per_s, ".1f")
    spread = row.trials.spread("images_per_s") if row.repeated else None
    return (
        f"{cell} ({spread[0]:.1f}–{spread[1]:.1f})" if spread and len(row.trials.kept) > 1 else cell
    )


def trials_cell(row: Row) -> str:
    t = row.trials
    return f"{len(t.kept)} of {len(t.runs)}" if t else "1 of 1"


def targets(row: Row) -> list[dict]:
    """The --target-accuracy records of the row's trials that finished (every trial's: trials are not dropped
    for their convergence)."""
    runs = row.trials.runs if row.trials else [row.result]
    return [r.target for r in runs if r.ok and r.target]


def target_cell(row: Row) -> str:
    """Time to target: the median timed training seconds to the target and the median epoch, with the range
    over trials; a run that never reached it is counted, not ranked."""
    records = targets(row)
    if not records:
        return "—"
    reached = [t for t in records if t["reached"]]
    missed = len(records) - len(reached)
    if not reached:
        return f"not reached in {row.result.config.epochs} epochs"
    times = [t["train_s"] for t in reached]
    epochs = [t["epoch"] for t in reached]
    cell = f"{statistics.median(times):.1f} s (epoch {statistics.median(epochs):g})"
    if len(reached) > 1:
        cell += f" [{min(times):.1f}-{max(times):.1f} s, epochs {min(epochs)}-{max(epochs)}]"
    if missed:
        cell += f"; {missed} of {len(records)} not reached"
    return cell


SUMMARY_HEADER = [
    "backend",
    "strategy",
    "devices",
    "batch",
    "lr",
    "s/epoch",
    "images/s",
    "TFLOP/s (of peak)",
    "speed-up",
    "efficiency",
    "test acc",
    "warm-up s",
    "peak mem MB",
    "params",
]


def device_name(result: Result) -> str:
    """The run's first device as its environment names it ("" if it names none)."""
    devices = (result.environment or {}).get("devices") or []
    return str(devices[0]) if devices else ""


def model_flops(row: Row) -> tuple[float | None, float | None]:
    """(achieved TFLOP/s, its fraction of the devices' datasheet peak): the model's training FLOPs per image
    (harness/reporting/flops.py) times images/s; the fraction only on a GPU whose peak at the run's precision is
    known (else None)."""
    c = row.result.config
    if not row.images_per_s:
        return None, None
    achieved = flops.training_flops(c.model, c.image_side) * row.images_per_s / 1e12
    name = device_name(row.result)
    peak = None if c.simulated or not name else flops.peak_tflops(name, c.levers.precision)
    return achieved, (achieved / (peak * c.devices) if peak else None)


def flops_cell(row: Row) -> str:
    """Achieved TFLOP/s and its fraction of a peak: the GPU's datasheet, else the framework's measured matmul."""
    achieved, mfu = model_flops(row)
    if achieved is None:
        return "—"
    if mfu is not None:
        return f"{achieved:.3g} ({mfu:.1%})"
    if row.matmul_peak:
        return f"{achieved:.3g} ({achieved / row.matmul_peak:.0%} of matmul)"
    return f"{achieved:.3g} (no peak known)"


def energy_records(row: Row) -> list[dict]:
    """The energy records of a configuration's runs that measured it (its kept trials'; common/energy.py)."""
    runs = row.trials.kept if row.trials else [row.result]
    return [r.energy for r in runs if r.energy and r.energy.get("measured")]


def energy_median(row: Row, figure: str) -> float | None:
    """The median of one of the energy record's figures over the trials that measured it."""
    values = [e[figure] for e in energy_records(row) if e.get(figure) is not None]
    return statistics.median(values) if values else None


def summary_cells(
    row: Row, repeated: bool, targeted: bool = False, energized: bool = False
) -> list[str]:
    r, c = row.result, row.result.config
    cells = [
        c.backend,
        c.variant,
        devices_cell(c),
        str(c.batch_size),
        f"{c.lr:g}",
        fmt(row.sec_per_epoch, ".2f"),
        images_cell(row),
        flops_cell(row),
        fmt(row.speedup, ".2f"),
        fmt(row.efficiency, ".0%"),
        fmt(row.test_acc, ".4f"),
        fmt(r.compile_s, ".2f"),
        peak_memory(r),
        params_cell(r),
    ]
    return (
        cells
        + ([target_cell(row)] if targeted else [])
        + ([fmt(energy_median(row, "joules_per_epoch"), ".4g")] if energized else [])
        + ([trials_cell(row)] if repeated else [])
    )


def summary_table(rows: list[Row]) -> list[str]:
    """The report's first table: one row per configuration that finished; a time-to-target column with
    --target-accuracy, an energy column where a run measured it, a trials column with --repeat."""
    repeated = any(row.repeated for row in rows)
    targeted = any(targets(row) for row in rows)
    energized = any(energy_records(row) for row in rows)
    body = [summary_cells(row, repeated, targeted, energized) for row in rows if row.result.ok]
    header = (
        SUMMARY_HEADER
        + (["time to target"] if targeted else [])
        + (["J/epoch"] if energized else [])
        + (["trials kept"] if repeated else [])
    )
    return table(header, body) if body else ["No run finished successfully."]


def summary_records(rows: list[Row]) -> list[dict]:
    """The summary as plain numbers (`harness report --format csv|json`): one record per configuration."""
    records = []
    for row in rows:
        r, c = row.result, row.result.config
        spread = row.trials.spread("images_per_s") if row.trials else None
        samples = row.trials.step_samples() if row.trials else []
        step = statistics.median(samples) if samples else r.step_time and r.step_time.median_s
        records.append(
            {
                "backend": c.backend,
                "strategy": c.variant,
                "devices": c.devices,
                "nodes": c.nodes.count,
                "simulated": c.simulated,
                "status": r.status,
                "batch": c.batch_size,
                "lr": c.lr,
                "sec_per_epoch": row.sec_per_epoch,
                "images_per_s": row.images_per_s,
                "images_per_s_min": spread and spread[0],
                "images_per_s_max": spread and spread[1],
                "tflops": model_flops(row)[0],
                "mfu": model_flops(row)[1],
                "speedup": row.speedup,
                "efficiency": row.efficiency,
                "test_acc": row.test_acc,
                "warmup_s": r.compile_s,
                "step_median_s": step,
                "epoch_over_steps": epoch_over_steps(row, step),
                "params": r.params,
                **target_figures(row),
                "joules_per_epoch": energy_median(row, "joules_per_epoch"),
                "images_per_joule": energy_median(row, "images_per_joule"),
                "trials": len(row.trials.runs) if row.trials else 1,
                "trials_kept": len(row.trials.kept) if row.trials else int(r.ok),
            }
        )
    return records


def target_figures(row: Row) -> dict:
    """Time to target as plain numbers: the medians over the trials that reached it, and how many did."""
    records = targets(row)
    reached = [t for t in records if t["reached"]]
    median = statistics.median
    return {
        "target_accuracy": records[0]["accuracy"] if records else None,
        "time_to_target_s": median(t["train_s"] for t in reached) if reached else None,
        "epochs_to_target": median(t["epoch"] for t in reached) if reached else None,
        "target_reached": f"{len(reached)} of {len(records)}" if records else None,
    }


def milliseconds(seconds: float | None) -> str:
    """Three significant digits without exponents: 1084, 35.8, 4.50, 0.00039."""
    if seconds is None:
        return "—"
    ms = 1e3 * seconds
    if ms >= 100:
        return f"{ms:.0f}"
    return f"{ms:.3g}" if ms >= 1 else f"{ms:.2g}"


def epoch_over_steps(row: Row, median_step_s: float | None) -> float | None:
    """The row's s/epoch (the summary's) over its steps at the median step time (the table's): the two
    figures agree when this is about 1 (common/results.py's epoch_over_steps)."""
    epochs = row.result.epochs
    if not row.sec_per_epoch or not epochs:
        return None
    return epoch_over_steps_of([row.sec_per_epoch], epochs[0].steps, median_step_s)
