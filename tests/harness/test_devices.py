"""GPU detection without a framework: nvidia-smi, then the driver's /proc files, CUDA_VISIBLE_DEVICES as CUDA
reads it, and one line saying how the devices were found. Every test makes up the host it runs on, so the
verdicts are the same on a machine with GPUs and on one without."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import cli
from harness.processes import devices
from tests.harness.helpers import fake_nvidia_smi, run_harness

H200 = "GPU-8a1c2b3d-0000-1111-2222-333344445555"
A100 = "GPU-8a9f0e1d-6666-7777-8888-9999aaaabbbb"
TWO_GPUS = [
    f"1, {A100}, NVIDIA A100-SXM4-80GB",
    f"0, {H200}, NVIDIA H200",
]  # (any order: the index decides)
MIG = "MIG-4e2f6a8c-1357-9bdf-0246-8ace13579bdf"


class Host:
    """A machine made up for one test: no nvidia-smi, no driver files, no device node until the test adds them."""

    def __init__(self, tmp_path: Path, monkeypatch):
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        self.proc = tmp_path / "proc" / "driver" / "nvidia" / "gpus"
        self.dev = tmp_path / "dev" / "nvidia0"
        self.monkeypatch = monkeypatch
        # PATH is replaced, not prefixed: a real nvidia-smi elsewhere on it must not be found
        monkeypatch.setenv("PATH", str(self.bin))
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        monkeypatch.setattr(devices, "PROC_GPUS", self.proc)
        monkeypatch.setattr(devices, "DEV_NVIDIA0", self.dev)

    def nvidia_smi(self, *gpus: str, **kwargs) -> None:
        fake_nvidia_smi(self.bin, list(gpus), **kwargs)

    def proc_gpu(self, bus_id: str, model: str, uuid: str) -> None:
        """A GPU as the driver lists it: /proc/driver/nvidia/gpus/<bus id>/information."""
        (self.proc / bus_id).mkdir(parents=True)
        (self.proc / bus_id / "information").write_text(
            f"Model: \t\t {model}\nIRQ:   \t\t 160\nGPU UUID: \t {uuid}\nVideo BIOS: \t ??.??.??.??.??\n"
            f"Bus Type: \t PCIe\nBus Location: \t {bus_id}\n"
        )

    def visible(self, value: str) -> None:
        self.monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)


@pytest.fixture
def host(tmp_path, monkeypatch) -> Host:
    return Host(tmp_path, monkeypatch)


# ------------------------------------------------------------------------ nvidia-smi


def test_every_gpu_nvidia_smi_lists_in_index_order(host):
    host.nvidia_smi(*TWO_GPUS)
    assert devices.detect() == devices.Detection(
        ["NVIDIA H200", "NVIDIA A100-SXM4-80GB"], "found by nvidia-smi"
    )


def test_indices_select_and_order_the_gpus(host):
    host.nvidia_smi(*TWO_GPUS)
    host.visible("1,0")
    assert devices.detect() == devices.Detection(
        ["NVIDIA A100-SXM4-80GB", "NVIDIA H200"], "found by nvidia-smi (CUDA_VISIBLE_DEVICES=1,0)"
    )


@pytest.mark.parametrize("entry", [A100, "GPU-8a9f"])
def test_a_gpu_named_by_its_uuid_or_a_unique_prefix(host, entry):
    """What Slurm and container runtimes set: this was the silent fall-back to simulated CPU devices."""
    host.nvidia_smi(*TWO_GPUS)
    host.visible(entry)
    found = devices.detect()
    assert found.gpus == ["NVIDIA A100-SXM4-80GB"]
    assert found.how == f"found by nvidia-smi (CUDA_VISIBLE_DEVICES={devices.abbreviate(entry)})"
    assert found.how.startswith("found by nvidia-smi (CUDA_VISIBLE_DEVICES=GPU-8a9f")


def test_full_uuids_are_abbreviated_in_the_line(host):
    host.nvidia_smi(*TWO_GPUS)
    host.visible(f"{H200},{A100}")
    assert (
        devices.detect().how
        == "found by nvidia-smi (CUDA_VISIBLE_DEVICES=GPU-8a1c2b3d…,GPU-8a9f0e1d…)"
    )


def test_an_ambiguous_prefix_names_no_gpu(host):
    host.nvidia_smi(*TWO_GPUS)
    host.visible("GPU-8a")  # both UUIDs start so: CUDA refuses to guess
    assert devices.detect() == devices.Detection(
        [],
        "no GPU visible: CUDA_VISIBLE_DEVICES=GPU-8a: CUDA stops at GPU-8a, which names no GPU here; "
        "2 GPUs found by nvidia-smi",
    )


@pytest.mark.parametrize(
    "value, note",
    [
        ("", "CUDA_VISIBLE_DEVICES is empty"),
        ("-1", "CUDA_VISIBLE_DEVICES=-1: CUDA stops at -1"),
    ],
)
def test_empty_or_minus_one_hides_every_gpu(host, value, note):
    host.nvidia_smi(*TWO_GPUS)
    host.visible(value)
    assert devices.detect() == devices.Detection(
        [], f"no GPU visible: {note}; 2 GPUs found by nvidia-smi"
    )


def test_an_entry_that_names_no_gpu_ends_the_list(host):
    """CUDA's rule: the devices after an invalid entry are ignored, not skipped over."""
    host.nvidia_smi(*TWO_GPUS)
    host.visible("1,7,0")
    assert devices.detect() == devices.Detection(
        ["NVIDIA A100-SXM4-80GB"],
        "found by nvidia-smi (CUDA_VISIBLE_DEVICES=1,7,0: CUDA stops at 7, which names no GPU here)",
    )


def test_a_gpu_named_twice_leaves_none(host):
    host.nvidia_smi(*TWO_GPUS)
    host.visible(f"0,{H200[:8]}")
    assert devices.detect() == devices.Detection(
        [],
        "no GPU visible: CUDA_VISIBLE_DEVICES=0,GPU-8a1c: GPU-8a1c names a GPU a second time, so CUDA shows none; "
        "2 GPUs found by nvidia-smi",
    )


def test_a_mig_instance_is_found_by_its_uuid(host):
    host.nvidia_smi(
        f"0, {H200}, NVIDIA H200",
        mig_listing=[
            f"GPU 0: NVIDIA H200 (UUID: {H200})",
            f"  MIG 1g.18gb     Device  0: (UUID: {MIG})",
        ],
    )
    host.visible(MIG)
    assert devices.detect() == devices.Detection(
        ["NVIDIA H200 MIG 1g.18gb"], "found by nvidia-smi (CUDA_VISIBLE_DEVICES=MIG-4e2f6a8c…)"
    )
    host.visible("MIG-0000")
    assert devices.detect() == devices.Detection(
        [],
        "no GPU visible: CUDA_VISIBLE_DEVICES=MIG-0000: CUDA stops at MIG-0000, which names no MIG instance "
        "`nvidia-smi -L` lists; 1 GPU found by nvidia-smi",
    )


# --------------------------------------------------------------- the driver's /proc files


def test_failing_nvidia_smi_falls_back_to_the_driver_files(host):
    host.nvidia_smi(
        *TWO_GPUS,
        exit_code=9,
        error="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
    )
    # made first: the bus id decides the order
    host.proc_gpu("0000:c1:00.0", "NVIDIA A100-SXM4-80GB", A100)
    host.proc_gpu("0000:41:00.0", "NVIDIA H200", H200)
    assert devices.detect() == devices.Detection(
        ["NVIDIA H200", "NVIDIA A100-SXM4-80GB"],
        f"found in the driver's files under {host.proc} (nvidia-smi failed with exit status 9: NVIDIA-SMI has "
        "failed because it couldn't communicate with the NVIDIA driver.)",
    )


def test_driver_files_honour_cuda_visible_devices_uuids(host):
    host.proc_gpu("0000:41:00.0", "NVIDIA H200", H200)
    host.proc_gpu("0000:c1:00.0", "NVIDIA A100-SXM4-80GB", A100)
    host.visible("GPU-8a9f")
    assert devices.detect() == devices.Detection(
        ["NVIDIA A100-SXM4-80GB"],
        f"found in the driver's files under {host.proc} (CUDA_VISIBLE_DEVICES=GPU-8a9f; nvidia-smi is not on PATH)",
    )


# ------------------------------------------------------------------------ nothing found


def test_nothing_anywhere_names_what_was_tried(host):
    assert devices.detect() == devices.Detection(
        [], f"no GPU found: nvidia-smi is not on PATH; {host.proc} is absent"
    )


def test_sources_that_list_no_gpu_say_so(host):
    host.nvidia_smi()
    host.proc.mkdir(parents=True)
    assert (
        devices.detect().how == f"no GPU found: nvidia-smi lists no GPU; {host.proc} lists no GPU"
    )


def test_a_device_node_alone_is_reported(host):
    host.dev.parent.mkdir()
    host.dev.touch()
    assert devices.detect() == devices.Detection(
        [],
        f"no GPU found: {host.dev} exists but neither nvidia-smi nor the driver's /proc files list a GPU "
        f"(nvidia-smi is not on PATH; {host.proc} is absent)",
    )


def test_gpus_are_described_by_count_and_name():
    assert devices.describe(["NVIDIA H200"]) == "1 GPU (NVIDIA H200)"
    assert devices.describe(["NVIDIA H200"] * 8) == "8 GPUs (8x NVIDIA H200)"
    assert devices.describe(["NVIDIA H200", "NVIDIA A100"]) == "2 GPUs (NVIDIA H200, NVIDIA A100)"


# ------------------------------------------------------------------------------ the CLI


def test_the_devices_line_for_each_choice(host):
    parse = cli.build_parser().parse_args
    assert (
        cli.choose_devices(parse(["--device", "cpu"])).line
        == "devices: simulated CPU devices (--device cpu)"
    )
    assert cli.choose_devices(parse([])).line == (
        f"devices: simulated CPU devices (no GPU found: nvidia-smi is not on PATH; {host.proc} is absent)"
    )
    host.nvidia_smi(f"0, {H200}, NVIDIA H200")
    assert cli.choose_devices(parse([])).line == "devices: 1 GPU (NVIDIA H200), found by nvidia-smi"
    # a GPU present, simulated all the same
    assert cli.choose_devices(parse(["--device", "cpu"])).kind == "cpu"


def test_the_plan_keeps_the_detection_line(host):
    host.nvidia_smi(f"0, {H200}, NVIDIA H200")
    args = cli.build_parser().parse_args(
        ["--backend", "torch", "--gpus", "1", "--dataset", "synthetic"]
    )
    plan = cli.build_plan(args)
    assert (plan.device_kind, plan.gpus, plan.detection) == (
        "gpu",
        ["NVIDIA H200"],
        "found by nvidia-smi",
    )


def test_device_gpu_without_a_gpu_is_one_line_with_the_reason(host, tmp_path, capsys):
    code = cli.main(
        [
            "--backend",
            "torch",
            "--device",
            "gpu",
            "--dataset",
            "synthetic",
            "--out",
            str(tmp_path / "r"),
        ]
    )
    assert code == 2
    assert capsys.readouterr().err == (
        f"harness: error: --device gpu: no GPU is visible (no GPU found: nvidia-smi "
        f"is not on PATH; {host.proc} is absent)\n"
    )
    assert not (tmp_path / "r").exists()


def fake_gpu_env(tmp_path: Path, **extra) -> dict:
    """A subprocess environment whose first nvidia-smi reports one NVIDIA H200 (a real one comes later on PATH)."""
    fake_nvidia_smi(tmp_path / "bin", [f"0, {H200}, NVIDIA H200"])
    return {
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "CUDA_VISIBLE_DEVICES": None,
        **extra,
    }


def test_list_shows_the_devices_line(tmp_path):
    result = run_harness("--backend", "torch", "--gpus", "1", "--list", env=fake_gpu_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "devices: 1 GPU (NVIDIA H200), found by nvidia-smi"


def test_device_gpu_hidden_by_cuda_visible_devices_exits_2_with_one_line(tmp_path):
    result = run_harness(
        "--backend",
        "torch",
        "--device",
        "gpu",
        "--dataset",
        "synthetic",
        "--out",
        str(tmp_path / "r"),
        env=fake_gpu_env(tmp_path, CUDA_VISIBLE_DEVICES=""),
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "harness: error: --device gpu: no GPU is visible (no GPU visible: "
        "CUDA_VISIBLE_DEVICES is empty; 1 GPU found by nvidia-smi)"
    ]
    assert result.stdout == ""
