"""A disk that is full, or fills during the run (a small tmpfs the test mounts itself, as root; skipped
otherwise): one line that says what could not be written, where and how much space was free, never a
traceback, and every finished result kept."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.helpers import fake_python
from tests.harness.test_faults import BASE, finish, start_harness

# Succeeds at once, then fills the disk at FAKE_FILL if it is set; a 2-device run writes its result as the
# 1-device one does (it is not reached when the disk is full).
FILLING_WORKER = r"""
import json, os, sys
cfg = json.load(open(sys.argv[sys.argv.index("--config") + 1]))
result = sys.argv[sys.argv.index("--result") + 1]
epochs = [{"epoch": 1, "time_s": 1.0, "steps": 2, "images": 64, "images_per_s": 64.0, "train_loss": 1.0,
           "train_acc": 0.5, "test_acc": 0.5}]
json.dump({"schema_version": 1, "status": "ok", "config": cfg, "environment": {}, "epochs": epochs,
           "compile_s": 0.1, "params": 1, "weights_hash": "w" * 64, "data_hash": "d" * 64, "error": None,
           "memory": {}}, open(result, "w"))
try:
    with open(os.environ["FAKE_FILL"], "wb") as f:
        while True:
            f.write(b"\0" * 65536)
            f.flush()
except (KeyError, OSError):
    pass
"""


@contextlib.contextmanager
def small_disk(tmp_path: Path, size_kb: int):
    """A tmpfs of `size_kb` kB mounted at tmp_path/disk, unmounted on the way out."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(path: Path) -> None:
    with contextlib.suppress(OSError), open(path, "wb") as f:
        while True:
            f.write(b"\0" * 65536)
            f.flush()


def test_an_out_on_a_full_disk_is_refused_in_one_line_and_leaves_nothing(tmp_path):
    with small_disk(tmp_path, 256) as disk:
        (disk / "reports").mkdir()
        fill(disk / "filler")
        proc = start_harness(
            *BASE,
            "--no-check",
            "--gpus",
            "1",
            "--python",
            f"torch={sys.executable}",
            "--out",
            str(disk / "reports"),
        )
        code, stderr = finish(proc)
        left = list((disk / "reports").iterdir())
    assert code == 2, stderr
    assert "Traceback" not in stderr
    (line,) = [x for x in stderr.splitlines() if x.startswith("harness: error:")]
    assert line.startswith(
        f"harness: error: --out {disk / 'reports'}: could not write {disk / 'reports'}"
    )
    assert line.endswith(": No space left on device (0 bytes free there)")
    assert left == []


def test_a_disk_that_fills_between_runs_fails_the_next_run_in_one_line_and_keeps_the_finished_one(
    tmp_path,
):
    script = tmp_path / "worker.py"
    script.write_text(FILLING_WORKER)
    python = fake_python(tmp_path, f'exec {sys.executable} {script} "$@"')
    temp = tmp_path / "temp"
    temp.mkdir()
    with small_disk(tmp_path, 512) as disk:
        proc = start_harness(
            *BASE,
            "--no-check",
            "--gpus",
            "1,2",
            "--python",
            f"torch={python}",
            "--out",
            str(disk / "reports"),
            env={"FAKE_FILL": str(disk / "filler"), "TMPDIR": str(temp)},
        )
        code, stderr = finish(proc)
    assert code == 1, stderr
    assert "Traceback" not in stderr
    (failed,) = [x for x in stderr.splitlines() if x.startswith("[torch scratch x2] failed:")]
    assert (
        failed.endswith(".config.json: No space left on device (0 bytes free there)")
        and "/runs/torch-" in failed
    )
    (kept,) = temp.glob("dpbench-*-results.json")
    assert "the results are kept in " + str(kept) in stderr
    runs = json.loads(kept.read_text())["runs"]
    assert [(r["config"]["devices"], r["status"]) for r in runs] == [(1, "ok"), (2, "failed")]


def test_a_full_temporary_folder_fails_the_check_in_one_line_and_the_runs_go_on(tmp_path):
    """The check writes its canonical weights and batches to the temporary folder before any worker starts:
    a full one fails the check (named in the report), not the harness; the runs still run and report."""
    script = tmp_path / "worker.py"
    script.write_text(FILLING_WORKER)
    python = fake_python(tmp_path, f'exec {sys.executable} {script} "$@"')
    # Room for Python's probe of the temporary folder (a full one, it silently replaces with /tmp), not for
    # LeNet's weights (240 kB).
    with small_disk(tmp_path, 64) as disk:
        out = tmp_path / "reports"
        proc = start_harness(
            *BASE,
            "--gpus",
            "1",
            "--python",
            f"torch={python}",
            "--out",
            str(out),
            env={"TMPDIR": str(disk)},
        )
        code, stderr = finish(proc, timeout=120)
    assert "Traceback" not in stderr
    (report,) = out.glob("*/report.md")
    text = report.read_text()
    (line,) = [x for x in text.splitlines() if x.startswith("- torch: could not be checked:")]
    assert (
        f"could not write {disk}/" in line
        and ": No space left on device (" in line
        and " free there)" in line
    )
    runs = json.loads((report.parent / "results.json").read_text())["runs"]
    assert [r["status"] for r in runs] == [
        "ok"
    ] and code == 0  # (the report's check section is the verdict)
