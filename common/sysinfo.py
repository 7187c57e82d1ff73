"""Facts about the host that every backend records the same way (no framework imports)."""

from __future__ import annotations

import os
import platform
import resource
from dataclasses import dataclass

# The vector instruction sets that set the width of XLA's and oneDNN's CPU kernels: cpuinfo's flag, the report's
# name. A host with AVX-512 runs those kernels twice as wide as an AVX2-only one: a figure depends on which it had.
VECTOR_SETS = (
    ("avx2", "AVX2"),
    ("avx512f", "AVX-512"),
    ("avx512_bf16", "AVX512-BF16"),
    ("amx_tile", "AMX"),
    ("amx_bf16", "AMX-BF16"),
)


CPUINFO = "/proc/cpuinfo"


def read_cpuinfo() -> str:
    """CPUINFO's text ("" where there is none or it cannot be read)."""
    try:
        with open(CPUINFO, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def cpuinfo_field(name: str) -> str | None:
    """The first processor's value of `name` in CPUINFO (None where there is none, or no such file)."""
    return first_processor(read_cpuinfo()).get(name)


def first_processor(text: str) -> dict[str, str]:
    """The `name : value` fields of cpuinfo's first processor (its first block of lines); odd lines skipped."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        name, sep, value = line.partition(":")
        if sep:
            fields.setdefault(name.strip(), value.strip())
    return fields


def whole(text: str | None) -> int | None:
    return int(text) if text and text.isascii() and text.isdigit() else None


def cpu_identity(cpuinfo: str) -> dict:
    """The CPU as cpuinfo's text names it: model name, vendor, family and model numbers (which tell apart CPUs a
    hypervisor names alike, e.g. AMD's Zen 3 and Zen 4 as "AMD EPYC"), and the vector sets of VECTOR_SETS among
    its flags, in that order. A field cpuinfo lacks is None (no flags at all: the vector sets are unknown)."""
    fields = first_processor(cpuinfo)
    flags = set(fields["flags"].split()) if "flags" in fields else None
    return {
        "cpu": fields.get("model name") or None,
        "cpu_vendor": fields.get("vendor_id") or None,
        "cpu_family": whole(fields.get("cpu family")),
        "cpu_model": whole(fields.get("model")),
        "vector_isa": None
        if flags is None
        else [name for flag, name in VECTOR_SETS if flag in flags],
    }


def machine() -> dict:
    """The host a run's figures depend on: its CPU (cpu_identity; without a model name, what Python's platform
    says) and the CPUs this process may use."""
    cpu = cpu_identity(read_cpuinfo())
    fallback = platform.processor() or platform.machine() or None
    return {**cpu, "cpu": cpu["cpu"] or fallback, "cpus": usable_cpus()}


# A core's float32 operations per cycle: 2 (a fused multiply-add) x 2 FMA units x the lanes of the widest vector
# it advertises. AMD's AVX-512 (Zen 4) runs as two 256-bit halves: the lanes of AVX2.
FMA_UNITS = 2


def float32_lanes(flags: set[str], vendor: str) -> int:
    if "avx512f" in flags and vendor != "AuthenticAMD":
        return 16
    if "avx2" in flags or "avx512f" in flags:
        return 8
    return 4


def cpu_peak() -> dict:
    """The host's theoretical float32 peak in TFLOP/s, with how it is counted: usable CPUs x float32 operations
    per cycle x the clock /proc/cpuinfo gives (a nominal one: turbo is not counted; under a hypervisor, what it
    reports), each CPU counted as a core. None where the clock or the flags are not known."""
    flags = set((cpuinfo_field("flags") or "").split())
    vendor = cpuinfo_field("vendor_id") or ""
    try:
        ghz = float(cpuinfo_field("cpu MHz") or "") / 1000
    except ValueError:
        ghz = None
    if not flags or not ghz:
        return {"fp32_tflops": None, "basis": "unknown: /proc/cpuinfo gives no clock or flags"}
    lanes = float32_lanes(flags, vendor)
    per_cycle = (
        2 * FMA_UNITS * lanes if "fma" in flags else 2 * lanes
    )  # without FMA: one mul, one add
    cpus = usable_cpus()
    return {
        "fp32_tflops": cpus * per_cycle * ghz / 1000,
        "basis": f"{cpus} CPUs x {per_cycle} FLOP/cycle ({lanes} float32 lanes"
        + (f", FMA, {FMA_UNITS} units" if "fma" in flags else ", no FMA")
        + f") x {ghz:.2f} GHz",
    }


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def host() -> dict:
    import numpy

    return {
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        **machine(),  # cpu, its vendor, family, model and vector sets, cpus
        "cpu_peak": cpu_peak(),
    }


def busy_cpu_seconds(cpus: set[int], stat: str = "/proc/stat") -> float | None:
    """The seconds `cpus` have spent busy since boot, whoever ran on them (/proc/stat; None where it cannot be read).
    A run pinned to CPUs of its own takes the difference: its processes' CPU time, including those whose parent never
    waited for them, which getrusage's children's count misses (torch's elastic workers)."""
    try:
        with open(stat) as f:
            lines = [line.split() for line in f if line.startswith("cpu") and line[3].isdigit()]
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal ...: busy is all but idle and iowait
    ticks = sum(
        sum(map(int, fields[1:4])) + sum(map(int, fields[6:9]))
        for fields in lines
        if int(fields[0][3:]) in cpus
    )
    return ticks / os.sysconf("SC_CLK_TCK")


def peak_rss_mb() -> float:
    """Peak resident memory of this process, in MiB.

    Linux's VmHWM belongs to the process's current memory image. getrusage's ru_maxrss is not
    reset by exec, so a worker started by a large harness process would report the harness's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


@dataclass(frozen=True, kw_only=True)
class EnvironmentRecord:
    """What a backend says about its run, by name: the framework and the libraries it trains with, what it sees,
    how it runs, and `details`, the backend's own settings (a kvstore type, a memory format) under their own
    names. `precision` holds the switches as the framework reads them back; `compile` is what --compile does
    here (None when off). environment() adds the host and the run config's part."""

    framework: str
    version: str
    libraries: dict[str, str]
    cuda: str | None
    cudnn: str | None
    devices: list[str]
    framework_gpus: int  # what the framework itself sees, whatever the harness found
    processes: int  # every node's processes, every role (a kvstore's servers too)
    threads: int  # per process
    precision: dict
    compile: str | None
    input_copies: str
    sgd_update: str
    collective: str | None
    batchnorm: str
    layout: str  # the layout the model computes in, by the tensors' strides: NCHW or NHWC
    details: dict


def environment(cfg, record: EnvironmentRecord) -> dict:
    """A run's environment record, one shape for every backend (docs/ARCHITECTURE.md, Glossary): the host,
    the backend's `record`, and from the run config the nodes, the precision mode (the run's --precision,
    beside the switches) and the speed levers as they run."""
    return {
        **host(),
        "framework": record.framework,
        "framework_version": record.version,
        "libraries": record.libraries,
        "cuda": record.cuda,
        "cudnn": record.cudnn,
        "devices": record.devices,
        "framework_gpus": record.framework_gpus,
        "nodes": cfg.nodes.count,  # process groups / hosts (loopback_nodes: on this one host)
        "loopback_nodes": cfg.nodes.count > 1 and cfg.nodes.loopback,
        "processes": record.processes,
        "threads_per_process": record.threads,
        "precision": {"mode": cfg.levers.precision, **record.precision},
        # (every lever; the compile mode is "compile"'s, below, as the record has always said it)
        "levers": {k: v for k, v in cfg.levers.flat().items() if k != "compile_mode"},
        "compile": record.compile,
        "input_copies": record.input_copies,
        "sgd_update": record.sgd_update,
        "collective": record.collective,
        "batchnorm": record.batchnorm,
        "layout": record.layout,
        "details": record.details,
    }
