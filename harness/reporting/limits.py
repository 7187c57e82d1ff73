"""Why a run is as fast as it is: where its step's time goes (the --profile breakdown, common/profiling.py), and how
far it is from the machine's limit (its achieved TFLOP/s against the framework's measured matmul peak and the
host's theoretical one, or a GPU's datasheet)."""

from __future__ import annotations

from common.profiling import CATEGORIES, coverage_problem
from harness.reporting import flops
from harness.reporting.tables import (
    Row,
    device_name,
    devices_cell,
    fmt,
    milliseconds,
    model_flops,
    table,
)


def profiled(rows: list[Row]) -> list[Row]:
    return [row for row in rows if row.result.ok and row.profile]


def shown_categories(rows: list[Row]) -> list[str]:
    """The categories some run spent time in, in CATEGORIES' order: a column none uses is left out."""
    used = set()
    for row in profiled(rows):
        seconds = row.profile_seconds
        used |= {k for k, v in seconds.items() if v and v > 0}
    return [k for k in CATEGORIES if k in used]


def on_a_device(rows: list[Row]) -> bool:
    """Whether some profiled run has a device trace: only then has the table a device busy column."""
    return any((row.profile or {}).get("device") for row in profiled(rows))


def breakdown_table(rows: list[Row]) -> list[str]:
    """Per profiled run: the profiled step, the timed median beside it, and each category's share of the step (on
    a GPU, of the timed step: common/profiling.py step_seconds); with a device trace, the share of its epoch's step
    the device is busy."""
    categories = shown_categories(rows)
    busy = on_a_device(rows)
    body = []
    for row in profiled(rows):
        c, p = row.result.config, row.profile
        seconds = row.profile_seconds
        step = sum(seconds.values())
        shares = [
            fmt(seconds.get(k) / step if step and seconds.get(k) is not None else None, ".0%")
            for k in categories
        ]
        trace = f"[trace]({p['trace']})" if p.get("trace") else "—"
        body.append(
            [
                c.backend,
                c.variant,
                devices_cell(c, simulated=False),
                milliseconds(p.get("step_s")),
                milliseconds(row.timed_step_s),
                *shares,
                *([fmt(row.device_busy, ".0%"), launches_cell(p.get("launches"))] if busy else []),
                trace,
            ]
        )
    if not body:
        return []
    header = ["backend", "strategy", "devices", "profiled step ms", "timed step ms"]
    header += [CATEGORIES[k] for k in categories]
    header += ["device busy", "launches / step"] if busy else []
    return table(header + ["trace"], body)


def launches_cell(launches: dict | None) -> str:
    """The host's launches per step: replayed CUDA graphs and single kernels ("—" where not counted)."""
    if not launches:
        return "—"
    return f"{launches['graphs']:.0f} graphs + {launches['kernels']:.0f} kernels"


def profile_notes(rows: list[Row]) -> list[str]:
    """The profiled runs without a breakdown, and those whose trace does not span their steps."""
    notes = []
    for row in profiled(rows):
        c, p = row.result.config, row.profile
        name = f"{c.backend} {c.variant} x{c.devices}"
        if p.get("error"):
            notes.append(f"- {name}: no breakdown: {p['error']}")
        elif problem := coverage_problem(p):
            notes.append(f"- {name}: {problem}; its shares describe the trace, not the steps")
    return notes


def profile_section(rows: list[Row], plotted: bool) -> list[str]:
    lines = breakdown_table(rows)
    if not lines:
        return []
    L = ["## Where the time goes", ""] + lines + [""]
    if plotted:
        L += ["![Where a step's time goes](breakdown.png)", ""]
    L += [
        "Each run's --profile steps, recorded with its framework's own profiler after everything timed (torch."
        "profiler, jax.profiler, MXNet's profiler; Keras through the framework it runs on), "
        + profiled_how(rows)
        + " Every instant of their wall time goes to one category: the op running "
        "then (the outermost op with a category, on any thread; where several run at once, the first in the "
        'table\'s order), or "untraced" where no op was. The shares add up to the profiled step. The profiled '
        "step is slower than the timed one by what the profiler costs. On a GPU only the device's kernels and "
        'copies count, and "untraced" is the device\'s idle time in a timed step: the timed step less the '
        "kernels' time, since the profiler slows the host that launches the kernels, not the kernels. A stream "
        "runs its kernels one after another: each keeps its own category, and an instant two overlapping "
        "kernels' timestamps share counts once. Device busy (a GPU run): the kernels' time per step over the "
        "epoch's time per step (s/epoch over the steps of an epoch), the share of a step the device works; well "
        "below 100% the host bounds the run, about 100% the device does. Launches / step: the CUDA graphs the "
        "host replayed and the kernels it launched one by one in a profiled step, counted from the trace (a "
        "replayed graph runs many kernels for one launch: torch's reduce-overhead, XLA's command buffers). The "
        "traces open in Perfetto "
        "(ui.perfetto.dev) or TensorBoard as they are; the mapping from op names to categories and its limits "
        "are in docs/profiling.md.",
        "",
    ]
    notes = profile_notes(rows)
    return L + (["**Breakdowns to read with care**:", ""] + notes + [""] if notes else [])


def profiled_how(rows: list[Row]) -> str:
    """How the profiled steps ran: each between two barriers, or (--profile-epoch) as an epoch runs them."""
    as_epoch = any(row.result.config.profile_epoch for row in rows if row.profile)
    if as_epoch:
        return (
            "as an epoch runs them (--profile-epoch): one barrier before the first and one after the last, each "
            "batch put ahead of its step, so the trace holds the input path and any wait between the steps."
        )
    return "each step between two barriers as a timed step is."


def host_peak(rows: list[Row]) -> tuple[float | None, str]:
    """The host's theoretical float32 peak and its basis, as the runs recorded it (common/sysinfo.py cpu_peak)."""
    for row in rows:
        peak = (row.result.environment or {}).get("cpu_peak") or {}
        if peak.get("fp32_tflops"):
            return peak["fp32_tflops"], peak.get("basis", "")
    return None, ""


def theoretical_peak(row: Row, cpu: float | None) -> float | None:
    """The run's theoretical peak: the datasheet of its GPUs (x devices), or the host's CPU peak in float32."""
    c = row.result.config
    if c.device_kind == "gpu":
        peak = flops.peak_tflops(device_name(row.result), c.levers.precision)
        return peak * c.devices if peak else None
    return cpu if c.levers.precision != "bf16" else None


def limits_table(rows: list[Row]) -> list[str]:
    cpu, _ = host_peak(rows)
    body = []
    for row in rows:
        achieved, _ = model_flops(row)
        if not row.result.ok or achieved is None:
            continue
        c = row.result.config
        theoretical = theoretical_peak(row, cpu)
        body.append(
            [
                c.backend,
                c.variant,
                devices_cell(c),
                c.levers.precision,
                f"{achieved:.3g}",
                fmt(row.matmul_peak, ".3g"),
                fmt(achieved / row.matmul_peak if row.matmul_peak else None, ".0%"),
                fmt(theoretical, ".3g"),
                fmt(achieved / theoretical if theoretical else None, ".0%"),
            ]
        )
    if not body:
        return []
    header = [
        "backend",
        "strategy",
        "devices",
        "precision",
        "achieved TFLOP/s",
        "matmul peak TFLOP/s",
        "of matmul",
        "theoretical TFLOP/s",
        "of theoretical",
    ]
    return table(header, body)


def limits_section(rows: list[Row]) -> list[str]:
    lines = limits_table(rows)
    if not lines:
        return []
    _, basis = host_peak(rows)
    return (
        ["## How far from the machine's limit", ""]
        + lines
        + [
            "",
            "Achieved: the model's training FLOPs per image (3 x the forward pass's convolution and dense "
            "multiply-adds) times images/s. Matmul peak: the best rate of the framework's own matrix product "
            "(float32, or bfloat16 for a bf16 run), measured on this host after the first run of each backend "
            "(common/loop.py measured_peak): what the framework can reach here at best. Theoretical: a GPU's "
            "datasheet times the devices, or the host's CPUs"
            + (f" ({basis})" if basis else "")
            + ", all the simulated devices of a CPU run sharing them. A run near its matmul peak is "
            "limited by the machine; one far below it loses its time elsewhere (the table above says where).",
            "",
        ]
    )
