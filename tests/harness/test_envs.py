"""Environment stamps: an environment is reused while its pins are unchanged, rebuilt when they change."""

from __future__ import annotations

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
