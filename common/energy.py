"""Energy over the timed parts of a run, read from the hardware's own energy counters at the timer's barriers.

A counter is read at the two instants that bound a timed interval (common/loop.py: an epoch, the warm-up), so that
energy and time cover the same interval; the joules between are the counters' differences, summed over the
devices this process reads and then over the run's processes. What is read, and never more than that:

* on a GPU, each device's board energy, NVML's `nvmlDeviceGetTotalEnergyConsumption` (millijoules since the driver
  loaded; Volta and newer; it updates every 10-100 ms), through `nvidia-ml-py` (the `pynvml` module). Megatron-Core's
  EnergyMonitor reads the same counter per iteration. nvidia-smi's `power.draw` is a one-second average that samples
  a fraction of the time on A100/H100 (arXiv:2312.02741): it is never integrated here;
* on a CPU, each package's RAPL counter (`/sys/class/powercap/intel-rapl:N/energy_uj`, AMD's packages there too),
  which wraps at `max_energy_range_uj`. Often absent in virtual machines, and readable by root only on kernels
  patched for CVE-2020-8694.

Nothing is estimated: where no counter can be read the run says "energy: not measured" and why. MLPerf Training's
power rules ask for at least 60 samples over the measured interval; an interval shorter than 60 of the counter's
updates is marked as such beside its figure (`SHORT`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

POWERCAP = Path("/sys/class/powercap")
MIN_UPDATES = 60  # MLPerf Training's power rules: at least 60 samples over the measured interval
NVML_UPDATE_S = 0.1  # the slowest NVML energy counter update (10-100 ms)
RAPL_UPDATE_S = 0.001  # RAPL updates about every millisecond
GPU_SCOPE = "GPU board, NVML counter"
CPU_SCOPE = "CPU package, RAPL"
SHORT = f"under {MIN_UPDATES} counter updates"


@dataclass(frozen=True)
class Counter:
    """One energy counter: `read()` gives its joules since an origin of its own; it wraps to 0 at `wraps_at`
    joules (RAPL), or never (None: a counter that goes backwards is refused)."""

    name: str
    read: Callable[[], float]
    wraps_at: float | None = None


@dataclass(frozen=True)
class Meter:
    """The counters of the devices one process reads, what they measure, how often they update, and the device
    context that changes the figure (`context()`: power limit, clocks, temperature, throttling; {} where there is
    none to read)."""

    scope: str
    counters: tuple[Counter, ...]
    update_s: float
    context: Callable[[], dict] = field(default=lambda: {})


@dataclass(frozen=True)
class NotMeasured:
    """Why there is no energy figure (one line for the report)."""

    why: str


@dataclass(frozen=True)
class Interval:
    """The joules of one interval (over every counter read), or why there is no figure for it; `short` where the
    interval held fewer than MIN_UPDATES of the counter's updates (said beside its figure)."""

    joules: float | None
    seconds: float
    refused: str | None = None
    short: bool = False


def difference(counter: Counter, start: float, end: float) -> tuple[float | None, str | None]:
    """The joules from `start` to `end` of `counter`, or (None, why): a counter that wraps is taken to have wrapped
    once; one that does not and went backwards is refused."""
    if end >= start:
        return end - start, None
    if counter.wraps_at is not None and start <= counter.wraps_at:
        return counter.wraps_at - start + end, None
    return None, f"{counter.name}'s energy counter went backwards ({start:.3f} J, then {end:.3f} J)"


class EnergyClock:
    """Reads a meter at the instants a timer starts and stops; `stop` gives the interval's joules."""

    def __init__(self, meter: Meter):
        self.meter = meter
        self.started: list[float] = []

    def start(self) -> None:
        self.started = [c.read() for c in self.meter.counters]

    def stop(self, seconds: float) -> Interval:
        """The interval since `start`, which took `seconds` by the timer."""
        ended = [c.read() for c in self.meter.counters]
        short = seconds < MIN_UPDATES * self.meter.update_s
        joules = 0.0
        for counter, start, end in zip(self.meter.counters, self.started, ended):
            part, why = difference(counter, start, end)
            if why:
                return Interval(None, seconds, why, short)
            joules += part
        return Interval(joules, seconds, None, short)


# --------------------------------------------------------------------------------------------------- CPU: RAPL


def rapl_meter(root: Path = POWERCAP) -> Meter | NotMeasured:
    """The host's CPU packages' RAPL counters, or why they cannot be read."""
    packages = (
        sorted(d for d in root.glob("intel-rapl:*") if re.fullmatch(r"intel-rapl:\d+", d.name))
        if root.is_dir()
        else []
    )
    if not packages:
        return NotMeasured(f"no RAPL counter on this host ({root} has no CPU package)")
    counters = []
    for package in packages:
        try:
            (package / "energy_uj").read_text()
            wraps = int((package / "max_energy_range_uj").read_text()) / 1e6
        except PermissionError:
            return NotMeasured(
                f"RAPL's {package / 'energy_uj'} is readable by root only here (the kernel's fix for CVE-2020-8694)"
            )
        except (OSError, ValueError) as e:
            return NotMeasured(f"RAPL's {package.name} cannot be read: {e}")
        counters.append(Counter(package_name(package), rapl_reader(package / "energy_uj"), wraps))
    return Meter(CPU_SCOPE, tuple(counters), RAPL_UPDATE_S)


def package_name(package: Path) -> str:
    try:
        return package.joinpath("name").read_text().strip() or package.name
    except OSError:
        return package.name


def rapl_reader(path: Path) -> Callable[[], float]:
    return lambda: int(path.read_text()) / 1e6


# ---------------------------------------------------------------------------------------------------- GPU: NVML


def nvml_meter(devices: int, environ=os.environ) -> Meter | NotMeasured:
    """The energy counters of the first `devices` GPUs this process sees (CUDA_VISIBLE_DEVICES's order), or why
    they cannot be read."""
    try:
        import pynvml
    except ImportError:
        return NotMeasured("nvidia-ml-py (the pynvml module) is not installed in this environment")
    try:
        pynvml.nvmlInit()
        handles = [nvml_handle(pynvml, seen) for seen in visible_gpus(environ, devices)]
        for handle in handles:
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except pynvml.NVMLError as e:
        return NotMeasured(f"NVML cannot read the GPUs' energy counters: {e}")
    counters = tuple(
        Counter(f"GPU {i}", nvml_reader(pynvml, handle)) for i, handle in enumerate(handles)
    )
    return Meter(GPU_SCOPE, counters, NVML_UPDATE_S, lambda: nvml_context(pynvml, handles))


def visible_gpus(environ, devices: int) -> list[str]:
    """The NVML names (index or UUID) of the first `devices` GPUs CUDA numbers for this process."""
    listed = [d.strip() for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return (listed or [str(i) for i in range(devices)])[:devices]


def nvml_handle(pynvml, seen: str):
    if seen.isdigit():
        return pynvml.nvmlDeviceGetHandleByIndex(int(seen))
    return pynvml.nvmlDeviceGetHandleByUUID(seen)


def nvml_reader(pynvml, handle) -> Callable[[], float]:
    return lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3


def nvml_context(pynvml, handles) -> dict:
    """Per GPU: its enforced power limit (W), SM clock (MHz), temperature (C) and whether anything but idleness
    holds its clocks down (power cap, thermal or hardware slowdown)."""
    out = []
    for handle in handles:
        reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
        holding = reasons & ~(
            pynvml.nvmlClocksThrottleReasonGpuIdle
            | pynvml.nvmlClocksThrottleReasonApplicationsClocksSetting
        )
        out.append(
            {
                "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3,
                "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                "temperature_c": pynvml.nvmlDeviceGetTemperature(
                    handle, pynvml.NVML_TEMPERATURE_GPU
                ),
                "throttled": bool(holding),
            }
        )
    return {"gpus": out}


def open_meter(
    device_kind: str, devices: int, environ=os.environ, root: Path = POWERCAP
) -> Meter | NotMeasured:
    """The meter of a run on `devices` devices of `device_kind` ("gpu": NVML; "cpu": the host's RAPL packages)."""
    return nvml_meter(devices, environ) if device_kind == "gpu" else rapl_meter(root)


# ------------------------------------------------------------------------------------------------ a run's energy


def reads_here(rank: int, nodes: int, loopback: bool, environ=os.environ) -> bool:
    """Whether this process reads its host's counters: one process a host, so that no counter is summed twice (the
    run's first process; across real hosts each host's first, LOCAL_RANK 0 where the engine has several a host)."""
    if rank == 0:
        return True
    return nodes > 1 and not loopback and environ.get("LOCAL_RANK", "0") == "0"


class RunEnergy:
    """The energy of a run's timed epochs as this process reads them: `meter` a Meter, NotMeasured, or None where
    another process reads this host's counters. The epochs' joules are summed over the processes once, after
    everything timed (`record`), so that no collective runs inside a timed part."""

    def __init__(self, meter: Meter | NotMeasured | None):
        self.meter = meter
        self.clock = EnergyClock(meter) if isinstance(meter, Meter) else None
        self.epochs: list[Interval] = []
        self.context: dict = {}

    def note_context(self, when: str) -> None:
        """The device context (power limit, clocks, temperature) at `when`, "start" or "end" of the timed loop."""
        if self.clock:
            self.context[when] = self.meter.context()

    def start(self) -> None:
        """At the barrier that opens an epoch's timer."""
        if self.clock:
            self.clock.start()

    def stop(self, seconds: float) -> None:
        """At the barrier that closes it, `seconds` by this process's timer."""
        if self.clock:
            self.epochs.append(self.clock.stop(seconds))

    def record(
        self, summed: Callable[[list[float]], list[float]], epochs: list[dict], target
    ) -> dict:
        """results.json's `energy` of the run, the same on every process: each epoch's joules summed over the
        processes that read (`summed`, the trainer's sum over ranks), or why there is none."""
        n = len(epochs)
        mine = [i.joules or 0.0 for i in self.epochs] if self.clock else [0.0] * n
        refused = next((i.refused for i in self.epochs if i.refused), None)
        failed = refused is not None or isinstance(self.meter, NotMeasured)
        counters = len(self.meter.counters) if self.clock else 0
        totals = summed([*mine, float(failed), float(self.clock is not None), float(counters)])
        joules, failures, readers, counters = totals[:n], *totals[n:]
        if isinstance(self.meter, NotMeasured) or refused or failures:
            why = self.meter.why if isinstance(self.meter, NotMeasured) else refused
            return {"measured": False, "why": why or "another process's counters could not be read"}
        return figures(self.meter, joules, epochs, target, int(readers), int(counters)) | {
            "short": any(i.short for i in self.epochs),
            "context": self.context,
        }


def figures(
    meter: Meter, joules: list[float], epochs: list[dict], target, readers: int, counters: int
) -> dict:
    """A run's energy figures from its epochs' joules: per epoch, images per joule, average watts (in all and per
    counter: a GPU, or a CPU package) and, with a target, the joules of the epochs up to it."""
    seconds = sum(e["time_s"] for e in epochs)
    images = sum(e["images"] for e in epochs)
    total = sum(joules)
    reached = target and target.get("reached")
    return {
        "measured": True,
        "scope": meter.scope,
        "processes": readers,
        "counters": counters,
        "epochs_j": joules,
        "joules_per_epoch": total / len(joules),
        "images_per_joule": images / total if total > 0 else None,
        "average_w": total / seconds,
        "per_counter_w": total / seconds / counters,
        "to_target_j": sum(joules[: target["epoch"]]) if reached else None,
    }
