"""Energy from the hardware's counters (common/energy.py): RAPL read from a powercap tree as the kernel lays it out,
a counter that wraps or goes backwards, a meter that cannot be read, and where the loop reads it (common/loop.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common import energy


def powercap(root: Path, packages: dict[int, tuple[int, int]]) -> Path:
    """A powercap tree: intel-rapl:N/{name,energy_uj,max_energy_range_uj} per package (µJ), and a core subdomain
    (intel-rapl:N:0) that is part of its package and must not be counted again."""
    for n, (uj, range_uj) in packages.items():
        package = root / f"intel-rapl:{n}"
        (package / f"intel-rapl:{n}:0").mkdir(parents=True)
        (package / "name").write_text(f"package-{n}\n")
        (package / "energy_uj").write_text(f"{uj}\n")
        (package / "max_energy_range_uj").write_text(f"{range_uj}\n")
        (package / f"intel-rapl:{n}:0" / "energy_uj").write_text("999999999\n")
    return root


def set_energy(root: Path, n: int, uj: int) -> None:
    (root / f"intel-rapl:{n}" / "energy_uj").write_text(f"{uj}\n")


def test_rapl_sums_the_packages_and_not_their_subdomains(tmp_path):
    root = powercap(tmp_path, {0: (1_000_000, 2**32), 1: (5_000_000, 2**32)})
    meter = energy.rapl_meter(root)
    assert meter.scope == energy.CPU_SCOPE
    assert [c.name for c in meter.counters] == ["package-0", "package-1"]
    clock = energy.EnergyClock(meter)
    clock.start()
    set_energy(root, 0, 3_500_000)  # +2.5 J
    set_energy(root, 1, 5_250_000)  # +0.25 J
    interval = clock.stop(seconds=1.0)
    assert interval.joules == pytest.approx(2.75) and interval.refused is None
    assert not interval.short  # 1 s is 1,000 RAPL updates


def test_a_counter_that_wraps_is_read_across_its_wrap(tmp_path):
    range_uj = 262_143_328_850  # a real package's max_energy_range_uj
    root = powercap(tmp_path, {0: (range_uj - 1_000_000, range_uj)})
    clock = energy.EnergyClock(energy.rapl_meter(root))
    clock.start()
    set_energy(root, 0, 2_000_000)  # wrapped: 1 J to the top, 2 J after it
    assert clock.stop(seconds=2.0).joules == pytest.approx(3.0)


def test_a_counter_that_goes_backwards_is_refused_with_the_reason():
    readings = iter([10.0, 4.0])
    meter = energy.Meter(
        "GPU board, NVML counter", (energy.Counter("GPU 0", lambda: next(readings)),), 0.1
    )
    clock = energy.EnergyClock(meter)
    clock.start()
    interval = clock.stop(seconds=30.0)
    assert interval.joules is None
    assert interval.refused == "GPU 0's energy counter went backwards (10.000 J, then 4.000 J)"


def test_an_interval_under_60_counter_updates_is_marked_short():
    meter = energy.Meter("GPU board, NVML counter", (energy.Counter("GPU 0", lambda: 0.0),), 0.1)
    clock = energy.EnergyClock(meter)
    clock.start()
    assert clock.stop(seconds=5.9).short and not (clock.start() or clock.stop(seconds=6.0).short)


def test_without_a_rapl_counter_energy_is_not_measured_saying_why(tmp_path):
    assert energy.rapl_meter(tmp_path / "absent") == energy.NotMeasured(
        f"no RAPL counter on this host ({tmp_path / 'absent'} has no CPU package)"
    )


def test_a_rapl_counter_readable_by_root_only_is_not_measured_saying_why(tmp_path, monkeypatch):
    root = powercap(tmp_path, {0: (1, 2**32)})
    real = Path.read_text

    def read_text(path, *args, **kwargs):
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    why = energy.rapl_meter(root).why
    assert why.startswith("RAPL's ") and "readable by root only" in why


def test_without_nvidia_ml_py_a_gpu_run_is_not_measured_saying_why(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # an import of it fails
    assert energy.open_meter("gpu", 2) == energy.NotMeasured(
        "nvidia-ml-py (the pynvml module) is not installed in this environment"
    )


def test_the_gpus_read_are_the_ones_cuda_numbers_for_the_process():
    assert energy.visible_gpus({}, 2) == ["0", "1"]
    assert energy.visible_gpus({"CUDA_VISIBLE_DEVICES": "3,1,2"}, 2) == ["3", "1"]
    assert energy.visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-ab12"}, 1) == ["GPU-ab12"]


# ------------------------------------------------------------------------------------------------- the report


def measured_energy(joules: list[float], seconds: float, **more) -> dict:
    total = sum(joules)
    return {
        "measured": True,
        "scope": energy.GPU_SCOPE,
        "processes": 1,
        "counters": 2,
        "epochs_j": joules,
        "joules_per_epoch": total / len(joules),
        "images_per_joule": 4096 / total,
        "average_w": total / seconds,
        "per_counter_w": total / seconds / 2,
        "to_target_j": None,
        "short": False,
        "context": {},
        **more,
    }


def test_the_report_gives_each_runs_energy_or_why_it_has_none(tmp_path):
    """Two epochs of 20.48 s: 4,096 J and 6,144 J on two GPUs (250 W, 125 W a GPU); a run whose counters could not
    be read says why; a result from before the record has neither a row nor a line, and a report of those alone
    no section."""
    from harness.reporting import energy as section
    from harness.reporting import tables
    from tests.harness.test_report import result

    read, unread, old = result(devices=2), result(strategy="ddp", devices=2), result(strategy="dp")
    read["energy"] = measured_energy([4096.0, 6144.0], 2 * 20.48)
    unread["energy"] = {
        "measured": False,
        "why": "nvidia-ml-py (the pynvml module) is not installed",
    }
    rows = tables.with_scaling(tables.as_results([read, unread, old]))
    lines = section.energy_section(rows)
    assert lines[0] == "## Energy"
    (row,) = [line for line in lines if line.startswith("| torch")]
    assert row == (
        "| torch | scratch | 2 (sim.) | GPU board, NVML counter, 2 counter(s) in 1 process(es) | 5120 | 0.4 | 250 "
        "| 125 | — | — |"
    )
    assert (
        "- torch ddp x2: energy not measured: nvidia-ml-py (the pynvml module) is not installed."
        in lines
    )
    assert section.energy_section(tables.with_scaling(tables.as_results([old]))) == []
    summary = tables.summary_table(rows)
    by_strategy = {line.split(" | ")[1]: line for line in summary[2:]}
    assert summary[0].endswith("| J/epoch |") and by_strategy["scratch"].endswith("| 5120 |")
    assert by_strategy["ddp"].endswith("| — |")  # the unmeasured run
    from harness.reporting.plots import plot_energy

    assert (
        plot_energy(rows, tmp_path / "energy.png") and (tmp_path / "energy.png").stat().st_size > 0
    )


@pytest.mark.parametrize(
    "change, problem",
    [
        (lambda e: e.update(measured="yes"), "energy.measured is not true or false"),
        (lambda e: e.update(epochs_j=[1.0, -2.0]), "energy.epochs_j is not a list of joules"),
        (lambda e: e.update(epochs_j=[1.0]), "energy.epochs_j has 1 epochs, the run 2"),
        (
            lambda e: e.update(average_w=float("nan")),
            "an energy figure is not a number of at least 0",
        ),
        (lambda e: e.update(scope=None), "energy.scope is not a string"),
    ],
)
def test_a_damaged_energy_record_is_refused_with_the_reason(change, problem):
    from common import results
    from tests.harness.test_report import result

    run = result()
    run["energy"] = measured_energy([1.0, 2.0], 40.0)
    assert results.result_problem(run) is None
    change(run["energy"])
    assert results.result_problem(run) == problem


def test_compare_gives_the_change_of_energy_only_between_counters_of_one_kind_on_one_machine():
    from common.results import Result
    from harness.reporting import comparison
    from harness.reporting.trials import group
    from tests.harness.test_report import result

    def trials(joules: float, scope: str = energy.GPU_SCOPE):
        run = result()
        run["energy"] = measured_energy([joules, joules], 40.96, scope=scope)
        run["step_time"] = {"median_s": 0.1, "samples_s": [0.1] * 20}
        return group([Result.from_dict(run)])[0]

    limits = comparison.Thresholds()
    machine = {"cpu": "EPYC", "gpus": ["H100"]}
    same = comparison.judge(trials(5000.0), trials(4000.0), limits, (machine, machine))
    assert "energy 5000 -> 4000 J/epoch (-20.0%, GPU board, NVML counter)" in same.note
    other = {"cpu": "EPYC", "gpus": ["H200"]}
    moved = comparison.judge(trials(5000.0), trials(4000.0), limits, (machine, other))
    assert moved.mark == comparison.NOT_COMPARABLE and "energy" not in moved.note
    scopes = comparison.energy_note(trials(5000.0), trials(4000.0, energy.CPU_SCOPE))
    assert scopes == "energy not compared: GPU board, NVML counter vs CPU package, RAPL"
    unread = trials(1.0)
    unread.kept[0].energy.clear()
    unread.kept[0].energy.update(measured=False, why="no RAPL counter on this host")
    assert comparison.energy_note(trials(5000.0), unread) == (
        "energy not measured in NEW: no RAPL counter on this host"
    )


class FakeNVML:
    """The few NVML calls the GPU meter makes, on two GPUs whose counters stand at 1,000 J and 2,000 J (in mJ);
    GPU 1 is held down by its power cap."""

    NVMLError = RuntimeError
    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0
    nvmlClocksThrottleReasonGpuIdle, nvmlClocksThrottleReasonApplicationsClocksSetting = 0x1, 0x2
    SW_POWER_CAP = 0x4

    def __init__(self):
        self.millijoules = {0: 1_000_000, 1: 2_000_000}

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self.millijoules[handle]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return self.nvmlClocksThrottleReasonGpuIdle | (self.SW_POWER_CAP if handle == 1 else 0)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 700_000  # mW

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return 1980

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 61


def test_the_gpu_meter_reads_nvmls_counters_in_joules_and_the_context_says_which_gpu_was_held_down(
    monkeypatch,
):
    nvml = FakeNVML()
    monkeypatch.setitem(__import__("sys").modules, "pynvml", nvml)
    meter = energy.open_meter("gpu", 2, environ={})
    assert meter.scope == energy.GPU_SCOPE and [c.name for c in meter.counters] == [
        "GPU 0",
        "GPU 1",
    ]
    clock = energy.EnergyClock(meter)
    clock.start()
    nvml.millijoules = {0: 1_250_000, 1: 2_300_500}
    assert clock.stop(seconds=10.0).joules == pytest.approx(550.5)
    gpus = meter.context()["gpus"]
    assert [g["throttled"] for g in gpus] == [False, True]
    assert gpus[0] == {
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1980,
        "temperature_c": 61,
        "throttled": False,
    }


def test_the_report_notes_a_short_epoch_and_a_gpu_held_down():
    from harness.reporting import energy as section

    held = {"end": {"gpus": [{"throttled": False}, {"throttled": True}]}}
    assert section.notes([measured_energy([1.0], 1.0, short=True, context=held)]) == (
        "an epoch shorter than 60 counter updates; a GPU's clocks were held down (power cap, thermal or "
        "hardware slowdown)"
    )
    assert section.notes([measured_energy([1.0], 1.0)]) == "—"
