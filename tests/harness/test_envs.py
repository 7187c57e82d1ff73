"""Environment stamps: an environment is reused while its pins are unchanged, rebuilt when they change."""

from __future__ import annotations

import os
from pathlib import Path

from harness.processes import envs


def test_stamp_follows_requirements(tmp_path, monkeypatch):
    monkeypatch.setattr(envs, "VENVS", tmp_path / "venvs")
    req = tmp_path / "requirements.txt"
    req.write_text("torch==2.13.0\n")
    python = envs.venv_python("torch")
    python.parent.mkdir(parents=True)
    python.write_text("")
    assert not envs.is_current("torch", req)  # no stamp: half-built, rebuild
    (tmp_path / "venvs" / "torch" / envs.STAMP).write_text(envs.stamp_for(req, envs.BASE_PYTHON))
    assert envs.is_current("torch", req)
    req.write_text("torch==2.14.0\n")
    assert not envs.is_current("torch", req)  # pins changed: rebuild


def test_a_package_on_the_callers_pythonpath_is_importable_in_a_worker(tmp_path, monkeypatch):
    """Packages carried to a host without network (PYTHONPATH) stay importable next to the project."""
    import subprocess
    import sys

    (tmp_path / "carried_package.py").write_text("VALUE = 42\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    # its byte code in the test's folder, not in the environment's cache, where it would outlive the test
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "pycache"))
    env = envs.worker_env(EXTRA="1")
    assert (
        env["PYTHONPATH"].split(os.pathsep) == [str(envs.ROOT), str(tmp_path)]
        and env["EXTRA"] == "1"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import carried_package, common; print(carried_package.VALUE)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "42", out.stderr


def test_a_child_harness_bootstraps_again(monkeypatch):
    """The bootstrap's loop guard stays in the harness it re-ran: a harness a child starts (a backend test's,
    in an interpreter without tqdm) must re-run itself inside .venvs/harness/ too."""
    monkeypatch.setenv(envs.BOOTSTRAPPED, "1")
    assert envs.BOOTSTRAPPED not in envs.worker_env()


def test_an_environment_writes_the_byte_code_it_compiles_inside_itself_whatever_the_variable_says(
    tmp_path, monkeypatch
):
    """An environment's packages come uncompiled: its interpreter must write what it compiles, under
    PYTHONDONTWRITEBYTECODE too (else every process compiles torch again), and only inside the environment (the
    checkout stays clean); a cache folder of the user's own is kept. The .pth is read as the environment's
    site-packages is, by site (-S: not this interpreter's own site-packages, which may hold one)."""
    import subprocess
    import sys

    target = tmp_path / "env"
    site_packages = target / "lib" / "python3.11" / "site-packages"
    site_packages.mkdir(parents=True)
    envs.keep_bytecode_inside(target)
    source = tmp_path / "checkout"
    source.mkdir()
    (source / "compiled_once.py").write_text("VALUE = 7\n")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)

    def import_it() -> list[Path]:
        """Where the byte code of compiled_once lands, imported in a fresh interpreter of the environment."""
        out = subprocess.run(
            [
                sys.executable,
                "-S",
                "-c",
                f"import site; site.addsitedir({str(site_packages)!r}); import compiled_once",
            ],
            cwd=source,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return list(tmp_path.rglob("compiled_once.*.pyc"))

    (written,) = import_it()
    assert written.parent.name == "checkout" and written.is_relative_to(target / envs.BYTECODE_DIR)
    assert not (source / "__pycache__").exists()
    written.unlink()
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "own"))
    (written,) = import_it()
    assert written.is_relative_to(tmp_path / "own")


def test_an_environment_whose_last_files_cannot_be_written_is_an_error_and_stays_unstamped(
    tmp_path, monkeypatch
):
    """A build whose .pth cannot be written (a full disk, say) is the build's EnvError, in one line, and the
    environment gets no stamp: it is rebuilt on next use, never used half-made. venv and pip are stood in for."""
    import subprocess

    monkeypatch.setattr(envs, "ROOT", tmp_path)  # (where its messages name files from)
    monkeypatch.setattr(envs, "VENVS", tmp_path / "venvs")
    target = tmp_path / "venvs" / "torch"

    def fake_run(cmd, **kwargs):
        # the venv step makes the folders; where the .pth goes, a folder stands in the way
        (target / "lib" / "python3.11" / "site-packages" / envs.BYTECODE_PTH).mkdir(
            parents=True, exist_ok=True
        )
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(envs.subprocess, "run", fake_run)
    req = tmp_path / "requirements.txt"
    req.write_text("torch==2.13.0\n")
    try:
        envs.ensure("torch", req, say=lambda _: None)
    except envs.EnvError as e:
        assert str(e).startswith("building .venvs/torch/ failed at its last files: ")
    else:
        raise AssertionError("the build did not fail")
    assert not (target / envs.STAMP).exists()


# ------------------------------------------------------------------ CPU or CUDA builds


def test_the_newest_cuda_a_driver_runs_picks_the_pins():
    assert envs.cuda_major((580, 65, 6)) == 13
    assert envs.cuda_major((575, 51, 3)) == 12
    assert envs.cuda_major((525, 60, 13)) == 12
    assert envs.cuda_major((525, 60, 12)) is None  # older than CUDA 12's: the CPU pins
    assert envs.cuda_major(None) is None
    backends = envs.ROOT / "backends"
    pins = {name: backends / name / "requirements.txt" for name in ("jax", "torch", "mxnet")}
    assert envs.requirements_for(pins["jax"], (580, 65, 6)).name == "requirements-cuda13.txt"
    assert envs.requirements_for(pins["jax"], (550, 54, 15)).name == "requirements-cuda12.txt"
    assert envs.requirements_for(pins["torch"], (550, 54, 15)).name == "requirements-cuda.txt"
    # no CUDA build
    assert envs.requirements_for(pins["mxnet"], (580, 65, 6)).name == "requirements.txt"
    assert all(envs.requirements_for(p, None) == p for p in pins.values())


def test_the_cuda_pins_are_the_cpu_pins_with_the_cuda_build():
    jax = envs.ROOT / "backends" / "jax"

    def pins(path):
        return {line for line in path.read_text().splitlines() if line and not line.startswith("#")}

    for major in (12, 13):
        cuda = pins(jax / f"requirements-cuda{major}.txt")
        assert cuda - pins(jax / "requirements.txt") == {f"jax[cuda{major}]==0.10.2"}
        assert pins(jax / "requirements.txt") - cuda == {"jax==0.10.2"}
    torch = envs.ROOT / "backends" / "torch"
    assert pins(torch / "requirements-cuda.txt") == pins(torch / "requirements.txt")


def test_the_driver_version_comes_from_nvidia_smi_else_the_drivers_proc_file(tmp_path, monkeypatch):
    from harness.processes import devices

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 550.54.15\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert devices.driver_version() == (550, 54, 15)
    (bin_dir / "nvidia-smi").unlink()
    proc = tmp_path / "version"
    proc.write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build\n"
    )
    monkeypatch.setattr(devices, "PROC_VERSION", proc)
    assert devices.driver_version() == (580, 65, 6)
    monkeypatch.setattr(devices, "PROC_VERSION", tmp_path / "absent")
    assert devices.driver_version() is None
    proc.write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
    )
    monkeypatch.setattr(devices, "PROC_VERSION", proc)
    assert devices.driver_version() == (550, 54, 15)
