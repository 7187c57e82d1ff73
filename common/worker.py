"""The worker entry point every backend shares: `python -m backends.<name> --config C --result R`
(a training run), or `--check JOB --result R.npz` (the measurements of `python -m harness check`).

It reads the run config, asks the backend to describe its environment and to run,
and writes exactly one result file (atomically), whatever happens. Exit status:
0 ok, 1 the run failed, diverged or was unavailable (the result says which).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import traceback

from common import caches
from common.backend import Backend
from common.config import MAX_SIMULATED_DEVICES, RunConfig
from common.errors import Diverged, Unsupported
from common.files import write_json_atomic
from common.results import new_result, tail

# Where a worker keeps its scratch files (torch's elastic error files of the DDP ranks): beside its result, inside the
# directory the harness removes whatever happens, so a worker killed by a signal leaves nothing in /tmp.
SCRATCH_ENV = "DPBENCH_SCRATCH_DIR"
# The run's --threads, for a framework that sizes its thread pools when it is imported (MXNet): the harness
# puts it in the worker's environment, because `python -m backends.<name>` imports the backend, and so its
# framework, before any of the worker's code can read the run config.
THREADS_ENV = "DPBENCH_THREADS"
# The simulated CPU devices a training run uses on this host, for a framework that makes them when it is imported
# (XLA: --xla_force_host_platform_device_count), put in a one-node run's environment by the harness for the same
# reason. XLA's CPU steps are slower with more devices than a run uses (8 cost a 1-device ResNet-18 step about 8%,
# `harness parity`); without it a backend makes MAX_SIMULATED_DEVICES, as the tests and the check use several counts.
DEVICES_ENV = "DPBENCH_DEVICES"


def simulated_devices() -> int:
    """The CPU devices a backend asks XLA for: the run's (DEVICES_ENV), else the most --gpus may ask for."""
    value = os.environ.get(DEVICES_ENV, "")
    return (
        int(value)
        if value.isdigit() and 1 <= int(value) <= MAX_SIMULATED_DEVICES
        else MAX_SIMULATED_DEVICES
    )


def ask_xla_for_cpu_devices() -> None:
    """XLA's CPU devices as simulated_devices() says (a count already in XLA_FLAGS is kept): set before jax is
    imported (by the jax and Keras backends' packages), since XLA reads the flag once, when jax initialises its CPU
    backend. It changes nothing on the GPUs."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "--xla_force_host_platform_device_count" not in flags:
        count = simulated_devices()
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


# The read end of a pipe whose write end only the harness holds: when the harness dies, even by SIGKILL, the
# kernel closes it, the worker reads the end of file, and kills its own process group (itself, and whatever
# it started: DDP ranks, the forkserver, ps-lite's scheduler and server), so nothing outlives the harness.
LIFELINE_ENV = "DPBENCH_LIFELINE_FD"


def watch_lifeline() -> None:
    """If the harness gave this worker a lifeline, watch it from a daemon thread (see LIFELINE_ENV)."""
    fd = os.environ.pop(LIFELINE_ENV, None)  # popped: the worker's children are not its watchers
    if fd is None or not fd.isdigit():
        return
    fd = int(fd)
    try:
        os.set_inheritable(fd, False)
    except OSError:
        return  # not an open descriptor: started by hand with the variable set

    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()


def scratch_dir() -> str | None:
    """The directory for a worker's temporary files (None: the system's temp directory)."""
    return os.environ.get(SCRATCH_ENV)


def main(backend: Backend, argv=None) -> int:
    """`backend` is a backend's common.backend.Backend (backends.<name>.BACKEND)."""
    parser = argparse.ArgumentParser(prog=f"python -m backends.{backend.name}")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--config", help="run-config JSON written by the harness: train and write a result JSON"
    )
    mode.add_argument(
        "--check", help="check-job JSON written by `harness check`: write measurements (.npz)"
    )
    parser.add_argument("--result", required=True, help="where to write the result")
    args = parser.parse_args(argv)
    watch_lifeline()
    os.environ.setdefault(SCRATCH_ENV, os.path.dirname(os.path.abspath(args.result)))
    if args.check:
        from common import measurements

        measurements.run(backend, args.check, args.result)
        return 0

    cfg = RunConfig.load(args.config)
    result = new_result(cfg.to_dict())
    compile_cache = caches.record()  # before anything compiles
    try:
        backend.check_supported(cfg)  # the run's one check: a run refused here joins no engine
        with backend.session(cfg):  # (jax lists its devices, for the record, only once joined)
            result["environment"] = {**backend.environment(cfg), "compile_cache": compile_cache}
            result.update(backend.train(cfg))
        result["status"] = "ok"
    except Unsupported as e:
        # What it would have run on, unless the refusal came from inside the session, after the record.
        result["environment"] = result["environment"] or refused_environment(backend, cfg)
        result["status"], result["error"] = "unavailable", str(e)
    except Diverged as e:
        result["status"], result["error"] = "diverged", str(e)
    except Exception as e:  # the harness needs the reason, not a dead process
        traceback.print_exc()
        result["status"], result["error"] = (
            "failed",
            tail(f"{type(e).__name__}: {e}\n\n{traceback.format_exc()}"),
        )
    write_json_atomic(args.result, result)
    return 0 if result["status"] == "ok" else 1


def refused_environment(backend: Backend, cfg: RunConfig) -> dict:
    """The environment record of a refused run; {} where even that cannot be made (the refusal is the news)."""
    try:
        return backend.environment(cfg)
    except Exception:
        return {}


def run_module(backend: Backend) -> None:
    sys.exit(main(backend))
