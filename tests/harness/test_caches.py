"""Compile caches (common/caches.py): every run starts cold in a folder of its own, unless the user shares one;
the worker records what it started with (no framework: the frameworks' own use of the folders is proven by the
cross-backend test on torch's --compile)."""

from __future__ import annotations

import json
import os
import sys

from common import caches
from tests.harness.helpers import fake_python, run_harness


def test_a_cold_run_gets_fresh_folders_for_the_caches_frameworks_keep_anyway_and_no_jax_cache(
    tmp_path,
):
    user = {
        "PATH": "/bin",
        "JAX_COMPILATION_CACHE_DIR": "/home/u/jax",
        "TORCHINDUCTOR_CACHE_DIR": "/x",
    }
    env = caches.apply(user, None, tmp_path / "run1.caches")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "run1.caches" / "torchinductor")
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "run1.caches" / "triton")
    assert "JAX_COMPILATION_CACHE_DIR" not in env  # the user's would make a jax warm-up warm
    assert env["PATH"] == "/bin" and env[caches.MODE_ENV] == "cold"


def test_a_shared_folder_holds_every_frameworks_cache_and_jax_caches_every_program(tmp_path):
    env = caches.apply({"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "5"}, "/shared", tmp_path)
    here = f"/shared/{caches.machine_folder({})}"
    assert {name: env[name] for name in caches.folders()} == {
        "TORCHINDUCTOR_CACHE_DIR": f"{here}/torchinductor",
        "TRITON_CACHE_DIR": f"{here}/triton",
        "JAX_COMPILATION_CACHE_DIR": f"{here}/jax",
    }
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
    assert env[caches.MODE_ENV] == "shared"


def test_a_shared_folder_keeps_one_cache_per_machine_and_kernel_cap(tmp_path, monkeypatch):
    """Code compiled on one CPU, or under one cap of its kernels (the portable pass's), is never read under
    another: Inductor's cache keys hold neither. Another CPU model, or another cap, is another folder; the same
    machine under the same caps, whatever else its environment says, the same one."""
    plain = caches.machine_folder({"PATH": "/bin"})
    assert plain == caches.machine_folder({"XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
    capped = [
        caches.machine_folder({"ATEN_CPU_CAPABILITY": "default"}),
        caches.machine_folder({"ONEDNN_MAX_CPU_ISA": "SSE41"}),
        caches.machine_folder({"XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2"}),
    ]
    assert len({plain, *capped}) == 4
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name : Another CPU 9000\nflags : fpu sse4_2\n\n")
    monkeypatch.setattr(caches.sysinfo, "CPUINFO", str(cpuinfo))
    other = caches.machine_folder({})
    assert other.startswith("Another-CPU-9000-") and other != plain


def test_the_record_counts_the_files_already_in_the_folders(tmp_path, monkeypatch):
    here = tmp_path / caches.machine_folder({})
    (here / "torchinductor" / "fxgraph").mkdir(parents=True)
    for name in ("a", "b"):
        (here / "torchinductor" / "fxgraph" / name).write_text("compiled")
    for name, value in caches.apply({}, str(tmp_path), tmp_path).items():
        monkeypatch.setenv(name, value)
    record = caches.record()
    assert record["mode"] == "shared" and record["files_at_start"] == 2
    assert record["folders"]["JAX_COMPILATION_CACHE_DIR"] == str(here / "jax")


# A worker that writes down the cache folders it was given, and a minimal result.
RECORDING_WORKER = """
import json, os, sys
cfg = json.load(open(sys.argv[sys.argv.index('--config') + 1]))
result_path = sys.argv[sys.argv.index('--result') + 1]
names = ('TORCHINDUCTOR_CACHE_DIR', 'JAX_COMPILATION_CACHE_DIR')
with open(sys.argv[0] + '.seen', 'a') as f:
    f.write(json.dumps({k: os.environ.get(k) for k in names}) + '\\n')
epochs = [{"epoch": 1, "time_s": 2.0, "steps": 8, "images": 256, "images_per_s": 128.0, "train_loss": 1.0,
           "train_acc": 0.5, "test_acc": 0.5}]
json.dump({"schema_version": 2, "status": "ok", "config": cfg, "environment": {}, "epochs": epochs,
           "final_test_acc": 0.5, "compile_s": 0.5, "params": 1, "weights_hash": "w", "data_hash": "d",
           "error": None}, open(result_path, "w"))
"""


def folders_given(tmp_path, *extra: str) -> list[dict]:
    """The cache folders each trial of a two-trial run was given, the user's JAX cache set."""
    script = tmp_path / "worker.py"
    script.write_text(RECORDING_WORKER)
    python = fake_python(tmp_path, f'exec {sys.executable} {script} "$@"')
    proc = run_harness(
        *("--backend", "torch", "--strategy", "scratch", "--model", "lenet", "--gpus", "1"),
        *("--device", "cpu", "--dataset", "synthetic", "--train-size", "256", "--test-size", "256"),
        *("--epochs", "1", "--no-check", "--timed-steps", "0", "--quiet", "--repeat", "2"),
        *("--python", f"torch={python}", "--out", str(tmp_path / "reports"), *extra),
        env={"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "users-jax")},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [json.loads(line) for line in (tmp_path / "worker.py.seen").read_text().splitlines()]


def test_each_trial_starts_cold_in_a_folder_of_its_own_which_the_report_does_not_keep(tmp_path):
    first, second = folders_given(tmp_path)
    assert first["TORCHINDUCTOR_CACHE_DIR"] != second["TORCHINDUCTOR_CACHE_DIR"]
    assert first["JAX_COMPILATION_CACHE_DIR"] is second["JAX_COMPILATION_CACHE_DIR"] is None
    (report,) = (tmp_path / "reports").iterdir()
    assert not any(p.name.endswith(".caches") for p in report.rglob("*"))


def test_with_compile_cache_every_trial_shares_the_users_folder(tmp_path):
    shared = tmp_path / "shared" / caches.machine_folder(os.environ)
    first, second = folders_given(tmp_path, "--compile-cache", str(tmp_path / "shared"))
    assert (
        first
        == second
        == {
            "TORCHINDUCTOR_CACHE_DIR": str(shared / "torchinductor"),
            "JAX_COMPILATION_CACHE_DIR": str(shared / "jax"),
        }
    )


def test_the_report_says_how_the_caches_started_naming_each_frameworks_cache():
    """The report's line, its words made from each backend.toml's [framework.caches]: the caches a framework keeps
    unasked get a cold folder, the others none; a shared folder is named by its machine folder's parent."""
    from harness.reporting.sections import compile_cache_lines
    from harness.reporting.tables import as_results
    from tests.harness.test_report import result

    def ran(record: dict):
        return as_results([{**result(), "environment": {"compile_cache": record}}])

    cold = ran({"mode": "cold", "folders": {}, "files_at_start": 0})
    assert compile_cache_lines(cold) == [
        "- **Compile caches**: cold: every run (each trial, each node) compiled from nothing, its caches "
        "(TorchInductor's, Triton's) in a fresh folder of its own; JAX kept none"
    ]
    here = "/shared/" + caches.machine_folder({})
    shared = ran(
        {
            "mode": "shared",
            "folders": {"JAX_COMPILATION_CACHE_DIR": here + "/jax"},
            "files_at_start": 3,
        }
    )
    assert compile_cache_lines(shared) == [
        f"- **Compile caches**: shared (--compile-cache /shared/{caches.machine_folder({})}): each run's warm-up "
        "could reuse what earlier runs compiled; 1 of 1 runs found a cache there already"
    ]
