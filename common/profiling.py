"""Where a step's time goes: a framework's own trace read into the same few categories for every framework.

`--profile N` records N more steps of a run with the framework's profiler (profilers/<framework>.py), after
the timed steps, so no timed figure changes. This module reads the trace it wrote (Chrome trace JSON, gzipped
or not: torch.profiler's, MXNet's profiler's, and the Perfetto trace jax.profiler writes) and attributes the
wall time of the profiled steps to CATEGORIES, by one rule for every framework:

* an event's category is the first of its framework's op names (framework_ops(), its backend.toml's [profile]
  ops) its name matches, or, where an enclosing event on the same thread has a category already, that one (the
  outermost match: torch's `aten::conv2d` and the `aten::mkldnn_convolution` inside it are one convolution; an
  `Optimizer.step` holds the element-wise ops it runs);
* each instant of the trace goes to the category of highest precedence running on any thread (CATEGORIES'
  order), so a framework's thread pools are not counted twice, and communication counts only where nothing
  computes: its exposed share;
* traced events that match no pattern are "other ops" (the framework's own work, Python, dispatch), and the
  rest of the measured wall time, where nothing was traced, is "untraced" (waiting, the profiler's gaps).

So the categories add up to the measured wall time of the profiled steps by construction; what is unaccounted
is shown, not hidden. The trace's span (its first event to its last) is checked against that wall time:
outside COVERAGE the report says the trace does not describe the steps.

On a GPU, when the trace holds device events (torch's `kernel` and memcpy events, XLA's `/device:GPU` lanes),
only those are attributed, and "untraced" is the device's idle time: what the host's overhead costs. A stream runs
its kernels one after another, never one inside another, so there each kernel keeps its own category and the
stream's time is the union of its kernels (kernel_segments). The profiler
slows the host that launches the kernels, not the kernels (on an H200 a profiled eager torch step took twice its
timed one), so the report counts a GPU's idle time against the timed step (step_seconds()).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from common import manifest

# The categories, in order of precedence (where several run at once, the first counts), with their labels.
CATEGORIES = {
    "conv_matmul": "conv & matmul",
    # MXNet's bulked segments: the convolutions of a forward or backward with the rest of it
    "fused": "fused",
    # pooling and the loss too
    "bn_elementwise": "BN & element-wise",
    "optimizer": "optimizer",
    # exposed: only where nothing computes
    "communication": "communication",
    # host to device, and layout changes
    "copies": "copies",
    # the framework's own work, Python
    "other_ops": "other ops",
    # waiting, the profiler's gaps
    "untraced": "untraced",
}

# A framework's op names by category, (category, regex) in order: the first regex a name matches (re.search,
# case-sensitive) decides.
Ops = tuple[tuple[str, str], ...]


def framework_ops(framework: str) -> Ops:
    """The op names of `framework`'s traces: the [profile] ops of the backend of that name's backend.toml (torch,
    jax, mxnet; Keras's traces name the framework it ran on). Data, so that the harness reads traces again without
    the framework (docs/profiling.md shows them)."""
    return manifest.load(framework).ops


# The trace's span over the measured wall time of the profiled steps must lie in this range for its breakdown to
# describe them: below, the trace missed part of the steps; above, it holds much that is not a step.
COVERAGE = (0.8, 1.25)

# Events of a device, not of the host: torch's CUDA activity categories.
DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
# Events that span the recording, not an op: torch's profiler session.
SESSION_CATEGORIES = {"Trace"}


@dataclass
class Recording:
    """What a framework's profiler recorded (profilers/<name>.py's `record`): the framework whose op names the trace
    holds (framework_ops()), and the trace file, once written."""

    framework: str
    path: Path | None = None


# Where a run's traces go: the harness names a folder per run in the report (harness/processes/runner.py); a worker
# started by hand writes them under ./traces.
TRACES_ENV = "DPBENCH_TRACES"


def traces_folder() -> Path:
    folder = Path(os.environ.get(TRACES_ENV) or "traces")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def summary(recording: Recording, folder: Path, wall_s: float, steps: int) -> dict:
    """A run's profile record: the framework, its trace's path in `folder`, the steps and their wall time, and
    the trace's breakdown (breakdown()), or `error`, why there is none (the run itself is not failed by it)."""
    record = {
        "framework": recording.framework,
        "trace": None,
        "steps": steps,
        "step_s": wall_s / steps,
    }
    path = recording.path
    if path is None or not Path(path).is_file():
        return {**record, "error": "the profiler wrote no trace"}
    record["trace"] = Path(path).relative_to(folder).as_posix()
    try:
        figures = breakdown(path, framework_ops(recording.framework), wall_s, steps)
        return {**record, **figures, "error": None}
    except TraceError as e:
        return {**record, "error": str(e)}


def reread(profile: dict, folder: Path) -> dict:
    """A stored profile record (summary()'s) made anew from its trace in `folder` (the report's), by this version's
    rules: what `harness report --reread-traces` writes back after the rules changed. As it was where it names no
    trace. TraceError, with the reason, where the trace is not there or does not read cleanly into finite figures:
    the caller keeps the stored record then, since a report is never made worse by reading it again."""
    trace = profile.get("trace")
    if not trace:
        return profile
    path = Path(folder) / trace
    if not path.is_file():
        raise TraceError("not in the report")
    try:
        ops = framework_ops(profile["framework"])
        record = {key: profile[key] for key in ("framework", "trace", "steps", "step_s")}
        wall_s = profile["step_s"] * profile["steps"]
    except (KeyError, TypeError, ValueError, OSError) as e:
        raise TraceError(
            f"its stored profile names no framework whose ops are known ({e})"
        ) from None
    try:
        figures = breakdown(path, ops, wall_s, profile["steps"])
    except TraceError as e:
        raise TraceError(str(e).removeprefix(f"{path.name}: ")) from None
    # the stored step_s, not wall_s / steps again: the same figure, without a rounding's change
    return {**record, **figures, "step_s": profile["step_s"], "error": None}


class TraceError(ValueError):
    """A trace that cannot be read: one line, meant for the report."""


@dataclass(frozen=True)
class Span:
    """One traced event: its lane (process, thread), its start and end in microseconds, its name."""

    lane: tuple
    start: float
    end: float
    name: str


# ------------------------------------------------------------------------ reading a trace


def read_events(path: Path) -> list[dict]:
    """A Chrome trace's events: the file is a list of events or an object with `traceEvents`."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, EOFError, ValueError, UnicodeDecodeError) as e:
        raise TraceError(f"{Path(path).name}: not a readable Chrome trace ({e})") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise TraceError(f"{Path(path).name}: no traceEvents list")
    return [e for e in events if isinstance(e, dict)]


def device_processes(events: list[dict]) -> set:
    """The processes a trace names as a GPU's (XLA names them `/device:GPU:0`)."""
    return {
        e.get("pid")
        for e in events
        if e.get("ph") == "M"
        and e.get("name") == "process_name"
        and "GPU" in str((e.get("args") or {}).get("name", ""))
    }


def spans(events: list[dict]) -> list[Span]:
    """The trace's timed events (complete `X` events, and `B`/`E` pairs per thread); on a GPU trace, only the
    device's."""
    gpu_pids = device_processes(events)
    on_device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES or e.get("pid") in gpu_pids]
    out, open_ = [], {}
    for e in on_device or [e for e in events if e.get("cat") not in SESSION_CATEGORIES]:
        kind, lane, name = e.get("ph"), (e.get("pid"), e.get("tid")), str(e.get("name", ""))
        start = e.get("ts")
        if not isinstance(start, (int, float)) or isinstance(start, bool):
            continue
        duration = e.get("dur") if kind == "X" else 0
        if not math.isfinite(start) or (
            isinstance(duration, (int, float)) and not math.isfinite(duration)
        ):
            # NaN or Infinity (not JSON, yet Python reads them) or 1e999: a damaged trace, never a figure
            raise TraceError(
                f"event {name[:60]!r} has a timestamp or duration that is not a finite number"
            )
        if kind == "X" and isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0:
            out.append(Span(lane, float(start), float(start + e["dur"]), name))
        elif kind == "B":
            open_.setdefault(lane, []).append((float(start), name))
        elif kind == "E" and open_.get(lane):
            begin, begun = open_[lane].pop()
            out.append(Span(lane, begin, max(begin, float(start)), begun))
    return out


def on_device(events: list[dict]) -> bool:
    return any(e.get("cat") in DEVICE_CATEGORIES for e in events) or bool(device_processes(events))


# ------------------------------------------------------------------------ attributing the time


def category(name: str, ops: Ops) -> str | None:
    for key, pattern in ops:
        if re.search(pattern, name):
            return key
    return None


def lane_segments(lane_spans: list[Span], ops: Ops) -> list[tuple[float, float, str]]:
    """One host thread's events as (start, end, category) pieces: each event takes the category of its outermost
    categorised enclosing event, else its own; an event matching nothing is "other_ops". Nested events split
    their parent, so the pieces do not overlap."""
    pieces, stack = [], []  # stack: (end, category) of the open events
    cursor = None
    for s in sorted(lane_spans, key=lambda s: (s.start, -s.end)):
        while stack and stack[-1][0] <= s.start:
            end, cat = stack.pop()
            if cursor < end:
                pieces.append((cursor, end, cat))
                cursor = end
        if stack and cursor < s.start:
            pieces.append((cursor, s.start, stack[-1][1]))
        inherited = next((cat for _, cat in stack if cat != "other_ops"), None)
        own = inherited or category(s.name, ops) or "other_ops"
        end = min(s.end, stack[-1][0]) if stack else s.end  # a child never outlives its parent
        stack.append((end, own))
        cursor = s.start
    while stack:
        end, cat = stack.pop()
        if cursor < end:
            pieces.append((cursor, end, cat))
            cursor = end
    return pieces


def kernel_segments(lane_spans: list[Span], ops: Ops) -> list[tuple[float, float, str]]:
    """One device stream's kernels and copies as (start, end, category) pieces, each its own: a stream runs them
    one after another, yet the tracer's timestamps overlap by fractions of a microsecond (half of an XLA stream's
    kernels start before the previous one ends). Nesting them as a host thread's ops would clip each such kernel
    to its predecessor's end and lose nearly all of it; attribute() counts an instant two pieces cover once."""
    return [(s.start, s.end, category(s.name, ops) or "other_ops") for s in lane_spans]


def attribute(pieces: list[tuple[float, float, str]]) -> dict[str, float]:
    """Microseconds per category: each instant to the category of highest precedence running then."""
    order = list(CATEGORIES)
    edges = sorted(
        [(start, 1, cat) for start, end, cat in pieces if end > start]
        + [(end, -1, cat) for start, end, cat in pieces if end > start]
    )
    running = dict.fromkeys(order, 0)
    totals = dict.fromkeys(order, 0.0)
    previous = None
    for t, change, cat in edges:
        if previous is not None and t > previous:
            top = next((c for c in order if running[c] > 0), None)
            if top is not None:
                totals[top] += t - previous
        running[cat] += change
        previous = t
    return totals


def breakdown(path: Path, ops: Ops, wall_s: float, steps: int) -> dict:
    """Seconds per step in each category of the trace at `path`, its op names read by `ops` (those of the framework
    whose profiler wrote it: framework_ops()), from the measured wall time of its `steps` steps: {"steps", "step_s",
    "trace_span_s", "coverage", "device", "seconds": {category: seconds per step}}. TraceError if the trace cannot
    be read or is empty."""
    return events_breakdown(read_events(path), Path(path).name, ops, wall_s, steps)


def events_breakdown(events: list[dict], name: str, ops: Ops, wall_s: float, steps: int) -> dict:
    """breakdown() of a trace's events already read (`name`: the trace's, for a TraceError). TraceError too where
    a figure is not a finite number: a damaged trace's breakdown never reaches a result."""
    try:
        timed = spans(events)
    except TraceError as e:
        raise TraceError(f"{name}: {e}") from None
    if not timed:
        raise TraceError(f"{name}: no timed events")
    device = on_device(events)
    segments = kernel_segments if device else lane_segments
    lanes: dict[tuple, list[Span]] = {}
    for s in timed:
        lanes.setdefault(s.lane, []).append(s)
    pieces = [p for lane in lanes.values() for p in segments(lane, ops)]
    micro = attribute(pieces)
    span_s = (max(s.end for s in timed) - min(s.start for s in timed)) / 1e6
    seconds = {key: micro[key] / 1e6 / steps for key in CATEGORIES if key != "untraced"}
    seconds["untraced"] = max(0.0, wall_s / steps - sum(seconds.values()))
    figures = {
        "steps": steps,
        "step_s": wall_s / steps,
        "trace_span_s": span_s,
        "coverage": span_s / wall_s if wall_s > 0 else None,
        "device": device,
        "seconds": seconds,
        **({"launches": launches(events, steps)} if device else {}),
    }
    unfinite = [key for key, value in numbers(figures) if not math.isfinite(value)]
    if unfinite:
        raise TraceError(f"{name}: its {', '.join(unfinite)} would not be finite numbers")
    return figures


def numbers(figures: dict, prefix: str = ""):
    """(dotted key, value) of every number in a breakdown, nested tables included."""
    for key, value in figures.items():
        if isinstance(value, dict):
            yield from numbers(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield f"{prefix}{key}", value


# The CUDA calls with which a host starts work on a GPU, as the tracers name them (the runtime's and the driver's):
# one replayed graph (CUDA graphs: torch's reduce-overhead, XLA's command buffers), or one kernel.
GRAPH_LAUNCH = re.compile(r"^(cudaGraphLaunch|cuGraphLaunch)\b")
KERNEL_LAUNCH = re.compile(r"^(cudaLaunchKernel|cuLaunchKernel|cudaLaunchCooperativeKernel)")


def launches(events: list[dict], steps: int) -> dict[str, float]:
    """The host's launches per profiled step, counted from the trace: {"graphs", "kernels"}. Whether a run replayed
    CUDA graphs is read here, not from its flags: a framework may skip its graphs without failing."""
    names = [str(e.get("name", "")) for e in events if e.get("ph") == "X"]
    return {
        "graphs": sum(1 for n in names if GRAPH_LAUNCH.match(n)) / steps,
        "kernels": sum(1 for n in names if KERNEL_LAUNCH.match(n)) / steps,
    }


def kernel_seconds(profile: dict | None) -> float | None:
    """A device trace's kernels and copies per step (every category but "untraced"): what the profiler does not
    slow. None without a device trace's breakdown."""
    if not profile or not profile.get("device") or not profile.get("seconds"):
        return None
    return sum(v for k, v in profile["seconds"].items() if k != "untraced")


def step_seconds(profile: dict, timed_step_s: float | None) -> dict[str, float]:
    """A breakdown's seconds per step in each category, as the report compares them. On a CPU, the profiled
    step's. On a GPU (a device trace), the kernels' seconds as traced and, as "untraced", the device's idle time
    in a timed step: what the timed step leaves (none where the kernels fill it), since the profiler's cost on the
    host lengthens only the idle time."""
    seconds = dict(profile.get("seconds") or {})
    busy = kernel_seconds(profile)
    if busy is not None and timed_step_s:
        seconds["untraced"] = max(0.0, timed_step_s - busy)
    return seconds


def coverage_problem(profile: dict) -> str | None:
    """Why a breakdown does not describe its steps (its trace's span against their wall time), or None."""
    coverage = profile.get("coverage")
    low, high = COVERAGE
    if coverage is None or not low <= coverage <= high:
        shown = "unknown" if coverage is None else f"{coverage:.0%}"
        return f"the trace spans {shown} of the profiled steps' wall time (expected {low:.0%}-{high:.0%})"
    return None
