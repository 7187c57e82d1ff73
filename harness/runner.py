"""Launch worker processes (a run's, a check's: `launch`), show a run's progress, collect its result.

The worker runs in its own process group, so a timeout or an interrupt kills it with every
process it started (DDP ranks included). Whatever happens, run() returns a result dict: the
worker's own, or a failed / timeout one with the tail of its output.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from common import progress
from common.config import RunConfig
from common.results import failed_result, load_result, tail
from common.worker import THREADS_ENV
from harness import envs, interrupts
from harness.envs import ROOT

KILL_GRACE_S = 5.0


def label(cfg: RunConfig) -> str:
    return f"{cfg.backend} {cfg.variant} x{cfg.devices}"


def not_run_result(cfg: RunConfig, status: str, reason: str) -> dict:
    return failed_result(cfg.to_dict(), status, reason)


class Console:
    """Progress on the terminal: a live tqdm bar per epoch on a TTY, plain lines otherwise (logs, --quiet)."""

    def __init__(self, quiet: bool = False, stream=sys.stderr):
        self.quiet, self.stream = quiet, stream
        self.live = stream.isatty() and not quiet
        self._bar: tqdm | None = None
        self._bar_key: tuple | None = None

    def say(self, text: str) -> None:
        self._close_bar()
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except OSError:
            pass  # the terminal is gone (it sent SIGHUP): the runs and the report go on without it

    def _close_bar(self) -> None:
        bar, self._bar, self._bar_key = self._bar, None, None
        if bar is not None:
            try:
                bar.close()   # leave=False: the bar's line is cleared
            except OSError:
                self.live = False

    def _progress(self, cfg: RunConfig, record: dict) -> None:
        """The epoch's bar, made at its first step (or after a line was printed), moved to `step`."""
        key = (label(cfg), record["epoch"], record["steps"])
        try:
            if self._bar_key != key:
                self._close_bar()
                self._bar = tqdm(total=record["steps"], desc=f"[{label(cfg)}] epoch {record['epoch']}/"
                                 f"{record['epochs']}", unit="step", file=self.stream, leave=False,
                                 dynamic_ncols=True)
                self._bar_key = key
            self._bar.update(record["step"] - self._bar.n)
        except OSError:
            self._bar, self._bar_key, self.live = None, None, False

    def started(self, cfg: RunConfig) -> None:
        if not self.quiet:
            sim = " (simulated)" if cfg.simulated else ""
            self.say(f"[{label(cfg)}{sim}] {cfg.model}, batch {cfg.batch_size}, lr {cfg.lr:g}, {cfg.epochs} epoch(s)")

    def event(self, cfg: RunConfig, record: dict) -> None:
        kind = record.get("event")
        if kind == "warmup" and not self.quiet:
            self.say(f"[{label(cfg)}] warm-up / compile: {record['seconds']:.2f} s")
        elif kind == "step" and self.live:
            self._progress(cfg, record)
        elif kind == "epoch" and not self.quiet:
            self.say(f"[{label(cfg)}] epoch {record['epoch']}/{record['epochs']}: {record['time_s']:.2f} s, "
                     f"{record['images_per_s']:.1f} img/s, loss {record['train_loss']:.4f}, "
                     f"test acc {record['test_acc']:.4f}")

    def finished(self, cfg: RunConfig, result: dict) -> None:
        status = result["status"]
        if status == "ok":
            acc = result.get("final_test_acc")
            self.say(f"[{label(cfg)}] ok" + (f": test acc {acc:.4f}" if acc is not None else ""))
        else:
            reason = (result.get("error") or "").strip().splitlines()
            self.say(f"[{label(cfg)}] {status}: {reason[-1] if reason else ''}")


def _relative_to_root(arg: str) -> str:
    """Paths inside the project shown relative to it: logs can be shared (and committed) as they are."""
    try:
        return str(Path(arg).relative_to(ROOT))
    except ValueError:
        return arg


def _pump(stream, lines: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line)
    lines.put(None)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the worker's process group, SIGKILL what is left after a grace period.

    Held against further interrupts: a second Ctrl-C during the grace period would otherwise skip
    the SIGKILL and leave a worker that ignores SIGTERM running after the harness is gone.
    """
    with interrupts.held():
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return  # the group is empty: nothing left behind
        try:
            proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # DDP ranks may outlive their parent
        except ProcessLookupError:
            pass
        proc.wait()


def launch(cmd: list[str], env: dict, log_path: Path, timeout: float,
           on_line: Callable[[str], bool] | None = None) -> tuple[int | None, list[str]]:
    """Run one worker process: (its exit status, or None if it was killed at `timeout`; its output lines).

    The worker runs from the project root in a new session (its own process group), stdout and stderr
    merged, every line written to `log_path` as it comes. `on_line` sees each line and returns True if it
    consumed it (a progress record), which is then left out of the returned output. On a timeout, an
    interrupt (Ctrl-C, SIGTERM, SIGHUP: raised here) or the worker's exit, its whole group is killed, so
    nothing it started (DDP ranks) outlives it. OSError if the process cannot be started."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, errors="replace", start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    deadline = time.monotonic() + timeout
    output: list[str] = []
    timed_out = False
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(_relative_to_root(a) for a in cmd) + "\n")
        try:
            while True:
                try:
                    line = lines.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
                except queue.Empty:
                    if time.monotonic() >= deadline:
                        timed_out = True
                        break
                    if proc.poll() is not None and lines.empty():
                        break  # exited; a stray child may still hold the pipe open
                    continue
                if line is None:
                    break
                log.write(line)
                if not (on_line and on_line(line)):
                    output.append(line)
        except BaseException:
            kill_group(proc)
            raise
        kill_group(proc)  # on timeout: the worker; otherwise: any stray process it left
    return (None if timed_out else proc.returncode), output


def run(cfg: RunConfig, python: str, workdir: Path, console: Console) -> dict:
    """One worker run: config file in, result file out, output logged to workdir/logs/."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{cfg.backend}-{cfg.variant}-x{cfg.devices}").strip("-")
    (workdir / "runs").mkdir(parents=True, exist_ok=True)
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    config_path, result_path = workdir / "runs" / f"{name}.config.json", workdir / "runs" / f"{name}.result.json"
    log_path = workdir / "logs" / f"{name}.log"
    cfg.save(config_path)
    env = envs.worker_env(PYTHONUNBUFFERED="1", **({THREADS_ENV: str(cfg.threads)} if cfg.threads else {}))
    cmd = [python, "-m", f"backends.{cfg.backend}", "--config", str(config_path), "--result", str(result_path)]

    def on_line(line: str) -> bool:
        record = progress.parse(line)
        if record is not None:
            console.event(cfg, record)
        return record is not None

    console.started(cfg)
    try:
        returncode, output = launch(cmd, env, log_path, cfg.timeout, on_line)
    except OSError as e:
        return not_run_result(cfg, "failed", f"could not start {python}: {e}")

    if returncode is None:
        # The worker's last output first, the reason last: the report's headline is the error's last line.
        result = failed_result(cfg.to_dict(), "timeout",
                               f"{''.join(output[-20:])}killed after --timeout {cfg.timeout:g} s")
    else:
        try:
            result = load_result(result_path, cfg.to_dict())
        except (OSError, ValueError) as e:
            reason = f"worker exited with status {returncode} and no valid result ({e})"
            # The report's headline is the error's last line: the worker's own last words if it failed,
            # but the reason itself if it exited 0 (its output then says nothing about what went wrong).
            error = (tail("".join(output)) + "\n" + reason if returncode == 0
                     else reason + "\n" + tail("".join(output)))
            result = failed_result(cfg.to_dict(), "failed", error)
    if result.get("error"):
        # Paths in the staging directory as they will be once it is renamed to the report's (runs/..., logs/...)
        result["error"] = result["error"].replace(f"{workdir}{os.sep}", "")
    result["log"] = f"logs/{log_path.name}"
    console.finished(cfg, result)
    return result
