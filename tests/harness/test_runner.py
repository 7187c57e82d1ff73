"""A worker that crashes, hangs or succeeds: the report is always written, with the right rows."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest

from tests.harness.helpers import fake_nvidia_smi, fake_python, run_harness

ANY_DEVICE = (
    "--backend",
    "torch",
    "--strategy",
    "scratch",
    "--dataset",
    "synthetic",
    "--model",
    "lenet",
    "--epochs",
    "1",
    "--train-size",
    "64",
    "--test-size",
    "32",
    "--batch-size",
    "32",
    "--quiet",
    "--no-check",
)
BASE = (*ANY_DEVICE, "--device", "cpu")  # simulated devices, whatever GPUs the host has


def only_report(out: Path) -> Path:
    reports = [p for p in out.iterdir()]
    assert len(reports) == 1 and not reports[0].name.startswith("."), reports
    return reports[0]


def processes_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_crashing_worker_gives_failed_row_and_report(tmp_path):
    python = fake_python(tmp_path, 'echo "simulated crash: CUDA error 700" >&2; exit 3')
    out = tmp_path / "reports"
    result = run_harness(*BASE, "--gpus", "1,2", "--python", f"torch={python}", "--out", str(out))
    assert result.returncode == 1
    report = only_report(out)
    runs = json.loads((report / "results.json").read_text())["runs"]
    assert [(r["config"]["devices"], r["status"]) for r in runs] == [(1, "failed"), (2, "failed")]
    assert "simulated crash: CUDA error 700" in runs[0]["error"]
    assert "exited with status 3" in runs[0]["error"]
    text = (report / "report.md").read_text()
    assert "## Failed or not run" in text and "simulated crash: CUDA error 700" in text
    assert (report / "logs" / "torch-scratch-x1.log").is_file()


def test_a_dead_workers_error_keeps_how_it_ended_whatever_it_printed(tmp_path):
    """A worker that printed MLPerf's log lines and pages of output, then died: its error still begins with how it
    ended (the line a failed node's headline is made of), and holds none of the MLPerf lines."""
    noise = 'for i in $(seq 300); do echo \':::MLLOG {"key": "seed", "i": \'$i\'}\'; done; '
    noise += (
        'for i in $(seq 100); do echo "loading shard $i of a long list of data files"; done; exit 3'
    )
    python = fake_python(tmp_path, noise)
    out = tmp_path / "reports"
    result = run_harness(*BASE, "--gpus", "1", "--python", f"torch={python}", "--out", str(out))
    assert result.returncode == 1
    (run,) = json.loads((only_report(out) / "results.json").read_text())["runs"]
    assert run["error"].startswith("worker exited with status 3 and no valid result"), run["error"][
        :200
    ]
    assert ":::MLLOG" not in run["error"] and "loading shard 100 of" in run["error"]


def test_a_worker_is_told_the_simulated_devices_its_run_uses(tmp_path):
    """XLA makes its CPU devices when jax is imported, and a step is slower with more of them than the run uses:
    each one-node CPU run's worker gets its own device count (common.worker.DEVICES_ENV)."""
    from common.worker import DEVICES_ENV

    python = fake_python(tmp_path, f'echo "devices=${DEVICES_ENV}" >&2; exit 3')
    out = tmp_path / "reports"
    run_harness(*BASE, "--gpus", "1,2", "--python", f"torch={python}", "--out", str(out))
    runs = json.loads((only_report(out) / "results.json").read_text())["runs"]
    assert ["devices=1" in runs[0]["error"], "devices=2" in runs[1]["error"]] == [True, True]


@pytest.mark.parametrize("value, devices", [("3", 3), ("", 16), ("0", 16), ("x", 16), ("17", 16)])
def test_a_backend_asks_xla_for_the_runs_devices_or_the_most_gpus_may_ask(
    monkeypatch, value, devices
):
    from common import worker

    monkeypatch.setenv(worker.DEVICES_ENV, value)
    assert worker.simulated_devices() == devices


def test_hanging_worker_is_killed_at_timeout_with_its_children(tmp_path):
    marker = "3117.25"  # a sleep no other process on the machine runs
    python = fake_python(tmp_path, f"echo 'loading the data'\nsleep {marker} &\nsleep {marker}")
    out = tmp_path / "reports"
    start = time.monotonic()
    result = run_harness(
        *BASE, "--gpus", "1", "--timeout", "2", "--python", f"torch={python}", "--out", str(out)
    )
    assert time.monotonic() - start < 60
    assert result.returncode == 1
    runs = json.loads((only_report(out) / "results.json").read_text())["runs"]
    assert [r["status"] for r in runs] == ["timeout"]
    assert runs[0]["error"].splitlines() == ["loading the data", "killed after --timeout 2 s"]
    text = (only_report(out) / "report.md").read_text()
    # the reason is the headline, not the output
    assert "timed out — killed after --timeout 2 s" in text
    assert "[torch scratch x1] timeout: killed after --timeout 2 s" in result.stderr
    assert processes_with(f"sleep {marker}") == []


FAKE_WORKER = r"""
import json, sys
args = sys.argv[sys.argv.index("--config") + 1], sys.argv[sys.argv.index("--result") + 1]
cfg = json.load(open(args[0]))
n = cfg["devices"]
print('@dpbench {"event": "warmup", "seconds": 0.5}', flush=True)
epochs = [{"epoch": e + 1, "time_s": 2.0 / n ** 0.5, "steps": 2, "images": 64, "images_per_s": 64 / (2.0 / n ** 0.5),
           "train_loss": 1.0 / (e + 1), "train_acc": 0.5, "test_acc": 0.5 + 0.1 * e} for e in range(cfg["epochs"])]
environment = {"framework": "fake", "devices": ["d"] * n}
json.dump({"schema_version": 1, "status": "ok", "config": cfg, "environment": environment,
           "epochs": epochs, "compile_s": 0.5, "params": 129068, "weights_hash": "w" * 64, "data_hash": "d" * 64,
           "error": None, "memory": {}}, open(args[1], "w"))
"""


def test_successful_workers_give_speedup_in_report(tmp_path):
    worker = tmp_path / "fake_worker.py"
    worker.write_text(FAKE_WORKER)
    import sys

    python = fake_python(tmp_path, f'exec {sys.executable} {worker} "$@"')
    out = tmp_path / "reports"
    result = run_harness(
        *BASE, "--epochs", "2", "--gpus", "1,4", "--python", f"torch={python}", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    report = only_report(out)
    text = (report / "report.md").read_text()
    # 4 devices: time / sqrt(4) -> twice the images/s: speed-up 2.00, efficiency 50%; TFLOP/s: LeNet's
    # 13.5 MFLOP a training image x images/s, no peak known for simulated devices
    flops = "(no peak known)"
    assert (
        f"| torch | scratch | 4 (sim.) | 32 | 0.2 | 1.00 | 64.0 | 0.000864 {flops} | 2.00 | 50% | 0.6000 |"
        in text
    )
    assert (
        f"| torch | scratch | 1 (sim.) | 32 | 0.05 | 2.00 | 32.0 | 0.000432 {flops} | 1.00 | 100% | 0.6000 |"
        in text
    )
    assert "Synthetic data" in text
    assert (
        "- Devices: **simulated** (--device cpu): each device is a replica on the host CPU" in text
    )
    # the devices line is printed even with --quiet
    assert result.stderr.splitlines()[0] == "devices: simulated CPU devices (--device cpu)"
    assert (report / "accuracy.png").stat().st_size > 1000
    assert (report / "throughput.png").stat().st_size > 1000


EVAL_ONLY_WORKER = r"""
import json, sys
args = sys.argv[sys.argv.index("--config") + 1], sys.argv[sys.argv.index("--result") + 1]
cfg = json.load(open(args[0]))
print('@dpbench {"event": "evaluated", "test_acc": 0.625}', flush=True)
json.dump({"schema_version": 1, "status": "ok", "config": cfg, "environment": {}, "epochs": [], "final_test_acc": 0.625,
           "compile_s": None, "params": 129068, "weights_hash": "w" * 64, "data_hash": None, "error": None,
           "memory": {}}, open(args[1], "w"))
"""


def test_evaluation_only_run_reports_its_accuracy(tmp_path):
    """--epochs 0 --load-weights: no training, one accuracy, a report all the same."""
    import sys

    from common import weights

    weights.save(tmp_path / "w.npz", weights.initial_weights("lenet", 0))
    worker = tmp_path / "eval_worker.py"
    worker.write_text(EVAL_ONLY_WORKER)
    python = fake_python(tmp_path, f'exec {sys.executable} {worker} "$@"')
    out = tmp_path / "reports"
    result = run_harness(
        *BASE,
        "--gpus",
        "1",
        "--epochs",
        "0",
        "--load-weights",
        str(tmp_path / "w.npz"),
        "--python",
        f"torch={python}",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    text = (only_report(out) / "report.md").read_text()
    assert "| torch | scratch | 1 (sim.) | 32 | 0.05 | — | — | — | — | — | 0.6250 |" in text
    assert "weights loaded from" in text


def test_a_gpu_run_says_how_its_gpus_were_found(tmp_path):
    """The console line, the report and results.json all say which GPUs ran and how they were found."""
    import sys

    fake_nvidia_smi(tmp_path / "bin", ["0, GPU-8a1c2b3d-0000-1111-2222-333344445555, NVIDIA H200"])
    worker = tmp_path / "fake_worker.py"
    worker.write_text(FAKE_WORKER)
    python = fake_python(tmp_path, f'exec {sys.executable} {worker} "$@"')
    out = tmp_path / "reports"
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": "GPU-8a1c"}
    result = run_harness(
        *ANY_DEVICE, "--gpus", "1", "--python", f"torch={python}", "--out", str(out), env=env
    )
    assert result.returncode == 0, result.stderr
    line = "1 GPU (NVIDIA H200), found by nvidia-smi (CUDA_VISIBLE_DEVICES=GPU-8a1c)"
    assert result.stderr.splitlines()[0] == f"devices: {line}"
    report = only_report(out)
    assert (
        "- Devices: 1 GPU(s): NVIDIA H200, found by nvidia-smi (CUDA_VISIBLE_DEVICES=GPU-8a1c)\n"
        in (report / "report.md").read_text()
    )
    saved = json.loads((report / "results.json").read_text())
    assert saved["detection"] == "found by nvidia-smi (CUDA_VISIBLE_DEVICES=GPU-8a1c)"
    assert saved["gpus"] == ["NVIDIA H200"] and saved["device_kind"] == "gpu"


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_console_draws_a_bar_on_a_terminal_and_plain_lines_elsewhere():
    from common.config import RunConfig
    from harness.processes import runner

    cfg = RunConfig(
        backend="torch",
        strategy="ddp",
        devices=2,
        device_kind="cpu",
        simulated=True,
        model="lenet",
        epochs=1,
        batch_size=32,
        lr=0.1,
        dataset="synthetic",
    )
    epoch = {
        "event": "epoch",
        "epoch": 1,
        "epochs": 1,
        "time_s": 1.0,
        "images_per_s": 32.0,
        "train_loss": 1.0,
        "test_acc": 0.5,
    }
    lines = [
        "[torch ddp x2] epoch 1/1: 1.00 s, 32.0 img/s, loss 1.0000, test acc 0.5000",
        "[torch ddp x2] ok: test acc 0.5000",
    ]
    for stream, quiet in ((Terminal(), False), (io.StringIO(), False), (Terminal(), True)):
        console = runner.Console(quiet=quiet, stream=stream)
        for step in (1, 2):
            console.event(cfg, {"event": "step", "step": step, "steps": 2, "epoch": 1, "epochs": 1})
        console.event(cfg, epoch)
        console.finished(cfg, {"status": "ok", "final_test_acc": 0.5})
        text = stream.getvalue()
        if isinstance(stream, Terminal) and not quiet:
            # the bar, then cleared
            assert "[torch ddp x2] epoch 1/1:" in text and "step" in text and "\r" in text
            assert text.rsplit("\r", 1)[1].splitlines() == lines
        else:
            assert text.splitlines() == lines[1:] if quiet else lines


def test_the_failed_nodes_grace_is_shortened_only_by_a_number_of_seconds_within_its_default():
    """The test suite shortens the wait after a node's failure (runner.FAILED_GRACE_ENV); anything else in the
    variable leaves the default, never a longer wait or a traceback."""
    from harness.processes.runner import FAILED_GRACE_ENV, failed_node_grace

    assert failed_node_grace({}) == 10.0
    assert failed_node_grace({FAILED_GRACE_ENV: "1"}) == 1.0
    for bad in ("", "soon", "-1", "nan", "3600"):
        assert failed_node_grace({FAILED_GRACE_ENV: bad}) == 10.0, bad


def test_how_a_worker_died_names_the_signal_and_reads_sigkill_with_the_cgroups_oom_count(tmp_path):
    """A signal by its name; SIGKILL as the out-of-memory killer's where the cgroup's count of its kills grew
    (cgroup v2's memory.events, v1's memory.oom_control, whichever the host has), as not its where the count
    stayed, and as often its where the host keeps no count."""
    from harness.processes import deaths

    assert deaths.how_it_died(3, None, None) == "worker exited with status 3"
    assert deaths.how_it_died(-15, 0, 0) == "worker killed by SIGTERM"
    assert deaths.how_it_died(-9, 0, 1).startswith(
        "worker killed by SIGKILL: the kernel's out-of-memory killer (this cgroup's out-of-memory kills went "
        "from 0 to 1"
    )
    assert "not by the out-of-memory killer" in deaths.how_it_died(-9, 2, 2)
    assert "often the kernel's out-of-memory killer" in deaths.how_it_died(-9, None, 1)
    # the count, where each kind of host keeps it
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    (v2 / "unified" / "job").mkdir(parents=True)
    (v2 / "unified" / "job" / "memory.events").write_text(
        "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n"
    )
    (v1 / "memory" / "job").mkdir(parents=True)
    (v1 / "memory" / "job" / "memory.oom_control").write_text(
        "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"
    )
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("4:memory:/job\n0::/job\n")
    assert deaths.oom_kills(cgroup, v2) == 2 and deaths.oom_kills(cgroup, v1) == 5
    assert deaths.oom_kills(cgroup, tmp_path / "none") is None
    assert deaths.oom_kills(tmp_path / "no-such-file", v2) is None


def test_a_killed_node_is_named_by_how_it_died_not_by_its_last_words():
    """A node that a signal ended fails the run in a headline saying so, not in a line of its output (the engine's
    chatter before it died); as it did for a node that exited with a status."""
    from types import SimpleNamespace

    from common.config import RunConfig
    from common.nodes import NodeSpec
    from common.results import failed_result
    from harness.processes import runner

    cfg = RunConfig(
        backend="jax", strategy="pmap", devices=2, nodes=NodeSpec(2, coordinator="127.0.0.1:1")
    )
    died = "worker killed by SIGKILL: often the kernel's out-of-memory killer and no valid result (no file)"
    results = [
        failed_result(cfg.to_dict(), "timeout", "stopped 1 s after another node had ended"),
        failed_result(
            cfg.to_dict(), "failed", f"{died}\n[Gloo] Rank 1 is connected to 1 peer ranks."
        ),
    ]
    nodes = [SimpleNamespace(cfg=cfg.with_nodes(rank=r)) for r in (0, 1)]
    merged = runner.merge_nodes(cfg, nodes, results, [2.0, 1.0])
    assert merged["error"].splitlines()[-1] == f"node 1 of 2 failed first: failed: {died}"
