"""Environment stamps: an environment is reused while its pins are unchanged, rebuilt when they change."""

from __future__ import annotations

import os

from harness import envs


def test_stamp_follows_requirements(tmp_path, monkeypatch):
    monkeypatch.setattr(envs, "VENVS", tmp_path / "venvs")
    req = tmp_path / "requirements.txt"
    req.write_text("torch==2.13.0\n")
    python = envs.venv_python("torch")
    python.parent.mkdir(parents=True)
    python.write_text("")
    assert not envs.is_current("torch", req)                     # no stamp: half-built, rebuild
    (tmp_path / "venvs" / "torch" / envs.STAMP).write_text(envs.stamp_for(req, envs.BASE_PYTHON))
    assert envs.is_current("torch", req)
    req.write_text("torch==2.14.0\n")
    assert not envs.is_current("torch", req)                     # pins changed: rebuild


def test_a_package_on_the_callers_pythonpath_is_importable_in_a_worker(tmp_path, monkeypatch):
    """Packages carried to a host without network (PYTHONPATH) stay importable next to the project."""
    import subprocess
    import sys
    (tmp_path / "carried_package.py").write_text("VALUE = 42\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    env = envs.worker_env(EXTRA="1")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(envs.ROOT), str(tmp_path)] and env["EXTRA"] == "1"
    out = subprocess.run([sys.executable, "-c", "import carried_package, common; print(carried_package.VALUE)"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "42", out.stderr


def test_a_child_harness_bootstraps_again(monkeypatch):
    """The bootstrap's loop guard stays in the harness it re-ran: a harness a child starts (a backend test's,
    in an interpreter without tqdm) must re-run itself inside .venvs/harness/ too."""
    monkeypatch.setenv(envs.BOOTSTRAPPED, "1")
    assert envs.BOOTSTRAPPED not in envs.worker_env()
