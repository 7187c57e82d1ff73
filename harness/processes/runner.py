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

from common import caches, mllog, progress
from common.config import RunConfig
from common.network import free_port, interface_of
from common.profiling import TRACES_ENV
from common.results import ERROR_TAIL_CHARS, failed_result, load_result, tail
from common.worker import DEVICES_ENV, LIFELINE_ENV, THREADS_ENV
from harness.nodes import rollcall
from harness.nodes.watch import PeerLost
from harness.processes import deaths, disk, envs, interrupts
from harness.processes.envs import ROOT
from harness.processes.logs import LogNotWritten, WorkerLogs

TRACES = "traces"  # the report's folder of --profile traces, one folder per run

KILL_GRACE_S = 5.0


def label(cfg: RunConfig) -> str:
    return f"{cfg.backend} {cfg.variant} x{cfg.devices}" + (
        f" on {cfg.nodes.count} nodes" if cfg.nodes.count > 1 else ""
    )


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
                bar.close()  # leave=False: the bar's line is cleared
            except OSError:
                self.live = False

    def _progress(self, cfg: RunConfig, record: dict) -> None:
        """The epoch's bar, made at its first step (or after a line was printed), moved to `step`."""
        key = (label(cfg), record["epoch"], record["steps"])
        try:
            if self._bar_key != key:
                self._close_bar()
                self._bar = tqdm(
                    total=record["steps"],
                    desc=f"[{label(cfg)}] epoch {record['epoch']}/{record['epochs']}",
                    unit="step",
                    file=self.stream,
                    leave=False,
                    dynamic_ncols=True,
                )
                self._bar_key = key
            self._bar.update(record["step"] - self._bar.n)
        except OSError:
            self._bar, self._bar_key, self.live = None, None, False

    def started(self, cfg: RunConfig) -> None:
        if not self.quiet:
            sim = " (simulated)" if cfg.simulated else ""
            self.say(
                f"[{label(cfg)}{sim}] {cfg.model}, batch {cfg.batch_size}, lr {cfg.lr:g}, {cfg.epochs} epoch(s)"
            )

    def event(self, cfg: RunConfig, record: dict) -> None:
        kind = record.get("event")
        if kind == "warmup" and not self.quiet:
            self.say(f"[{label(cfg)}] warm-up / compile: {record['seconds']:.2f} s")
        elif kind == "step" and self.live:
            self._progress(cfg, record)
        elif kind == "epoch" and not self.quiet:
            self.say(
                f"[{label(cfg)}] epoch {record['epoch']}/{record['epochs']}: {record['time_s']:.2f} s, "
                f"{record['images_per_s']:.1f} img/s, loss {record['train_loss']:.4f}, "
                f"test acc {record['test_acc']:.4f}"
            )
        elif kind == "rounding" and not self.quiet:
            self.say(
                f"[{label(cfg)}] the compressed exchange's rounding: {record['first']:.2g} of the first "
                f"step's update, {record['last']:.2g} after {record['steps']:g} steps"
            )
        elif kind == "profiled" and not self.quiet:
            self.say(
                f"[{label(cfg)}] profiled {record.get('steps')} step(s) with the framework's profiler"
            )

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


def _pump(stream, lines: queue.Queue, index: int = 0) -> None:
    for line in iter(stream.readline, ""):
        lines.put((index, line))
    lines.put((index, None))


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


def _start(cmd: list[str], env: dict) -> subprocess.Popen:
    lifeline = _lifeline()
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**env, LIFELINE_ENV: str(lifeline)},
        pass_fds=(lifeline,),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        start_new_session=True,
    )


_lifeline_fds: tuple[int, int] | None = None


def _lifeline() -> int:
    """The read end of this harness's lifeline pipe (common/worker.py watch_lifeline), made once: its write end
    stays open, unwritten, in this process alone (not inheritable), until the process ends however it ends."""
    global _lifeline_fds
    if _lifeline_fds is None:
        _lifeline_fds = os.pipe()
    return _lifeline_fds[0]


def launch(
    cmd: list[str],
    env: dict,
    log_path: Path,
    timeout: float,
    on_line: Callable[[str], bool] | None = None,
) -> tuple[int | None, list[str]]:
    """Run one worker process: (its exit status, or None if it was killed at `timeout`; its output lines).

    The worker runs from the project root in a new session (its own process group), stdout and stderr
    merged, every line written to `log_path` as it comes. `on_line` sees each line and returns True if it
    consumed it (a progress record), which is then left out of the returned output. On a timeout, an
    interrupt (Ctrl-C, SIGTERM, SIGHUP: raised here) or the worker's exit, its whole group is killed, so
    nothing it started (DDP ranks) outlives it. OSError if the process cannot be started."""
    ((code, output, _),) = launch_all([cmd], env, [log_path], timeout, on_line)
    return code, output


def launch_all(
    cmds: list[list[str]],
    env: dict,
    log_paths: list[Path],
    timeout: float,
    on_line: Callable[[str], bool] | None = None,
    grace: float = 0.0,
    failed_grace: float | None = None,
    lost: Callable[[], str | None] | None = None,
    sample: Callable[[list[int]], None] | None = None,
) -> list[tuple[int | None, list[str], float]]:
    """`launch` for processes that work together (the nodes of a run), started at once, one deadline for all.

    Once one has exited, the others get `grace` seconds to end too (`failed_grace`, if given, once one has
    failed), then their groups are killed: a node whose peer died must not wait on it until --timeout.
    `on_line` sees the first process's lines only; the others' progress records are left out of their output.
    `lost` is asked every second whether a peer host was lost (harness/nodes/watch.py): if so every process's group
    is killed and PeerLost raised with its line. `sample` is handed the pids still running as each line comes, and
    at least every second (deaths.PeakRSS: their peak memory while they live).
    Each process's (exit status, or None if still running at the deadline or after the grace; its output;
    when it was first seen ended, on the monotonic clock: the order in which they failed)."""
    # Made before any process starts: a log that cannot be made fails the launch.
    logs = WorkerLogs(
        log_paths, ["$ " + " ".join(_relative_to_root(a) for a in cmd) for cmd in cmds]
    )
    procs: list[subprocess.Popen] = []
    try:
        for cmd in cmds:
            procs.append(_start(cmd, env))
    except BaseException:
        logs.close()
        for proc in procs:
            kill_group(proc)
        raise
    lines: queue.Queue = queue.Queue()
    for i, proc in enumerate(procs):
        threading.Thread(target=_pump, args=(proc.stdout, lines, i), daemon=True).start()
    deadline = time.monotonic() + timeout
    outputs: list[list[str]] = [[] for _ in procs]
    open_streams, overdue, ended = set(range(len(procs))), set(), {}
    try:
        while open_streams:
            exited = _note_exits(procs, ended, sample)
            if exited and len(exited) < len(procs):
                failed = failed_grace is not None and any(p.returncode != 0 for p in exited)
                deadline = min(deadline, time.monotonic() + (failed_grace if failed else grace))
            if lost is not None and lost():
                raise PeerLost(lost())
            try:
                i, line = lines.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    overdue = {i for i, p in enumerate(procs) if p.poll() is None}
                    break
                if len(exited) == len(procs) and lines.empty():
                    break  # all exited; a stray child may still hold a pipe open
                continue
            if line is None:
                open_streams.discard(i)
                continue
            logs.write(i, line)
            if i == 0 and on_line and on_line(line):
                continue
            if i > 0 and progress.parse(line) is not None:
                continue  # the other nodes' progress: node 0 reports the run's
            outputs[i].append(line)
    except BaseException:
        for proc in procs:
            kill_group(proc)
        raise
    finally:
        logs.close()
    for proc in procs:
        kill_group(proc)  # on a timeout: the worker; otherwise: any stray process it left
    now = time.monotonic()
    for i, broken in logs.broken.items():
        outputs[i].append(f"(the worker's log stopped early: {broken})\n")
    return [
        (None if i in overdue else p.returncode, outputs[i], ended.get(i, now))
        for i, p in enumerate(procs)
    ]


def _note_exits(
    procs: list[subprocess.Popen], ended: dict[int, float], sample=None
) -> list[subprocess.Popen]:
    """The processes that have exited, each first seen ended now (in `ended`, by index) if not before; the others'
    pids handed to `sample`, if given."""
    for i, p in enumerate(procs):
        if p.poll() is not None:
            ended.setdefault(i, time.monotonic())
    if sample is not None:
        sample([p.pid for i, p in enumerate(procs) if i not in ended])
    return [procs[i] for i in ended]


def run(
    cfg: RunConfig,
    python: str,
    workdir: Path,
    console: Console,
    trial: int | None = None,
    keep: Callable[[dict], None] | None = None,
) -> dict:
    """One worker run (one process per node of this host): config file in, result file out, output logged to
    workdir/logs/. With several nodes, node 0's result is the run's, failed with the first failing node's error
    if any failed. `trial` (--repeat) names the log and is recorded in the result. `keep` is handed the result
    before the run is announced (`ended`), and from the moment its workers have ended until it is kept a stop
    signal waits: an interrupt then comes after the result is kept, never between the two."""
    return _run(cfg, python, workdir, console, trial, keep)


def ended(
    cfg: RunConfig,
    result: dict,
    console: Console,
    keep: Callable[[dict], None] | None = None,
    trial: int | None = None,
) -> dict:
    """A run's end: its result (with its `trial`) handed to `keep` first, then announced (`ok`, or why not),
    the two held against a stop signal, which is raised after them: a run announced is a run kept."""
    if trial is not None:
        result["trial"] = trial
    with interrupts.held():
        if keep is not None:
            keep(result)
        console.finished(cfg, result)
    return result


def _run(
    cfg: RunConfig,
    python: str,
    workdir: Path,
    console: Console,
    trial: int | None,
    keep: Callable[[dict], None] | None,
) -> dict:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{cfg.backend}-{cfg.variant}-x{cfg.devices}").strip(
        "-"
    )
    if cfg.nodes.count > 1:
        name += f"-{cfg.nodes.count}nodes"
    if trial is not None:
        name += f"-trial{trial}"
    if cfg.nodes.count > 1 and cfg.nodes.loopback:
        cfg = cfg.with_nodes(
            coordinator=f"127.0.0.1:{free_port()}",  # free now, on this host
            local_addr="127.0.0.1",
            interface=interface_of("127.0.0.1"),
        )
    watch = None  # across hosts: the run's heartbeats with the other hosts (harness/nodes/watch.py)
    if cfg.nodes.count > 1 and not cfg.nodes.loopback:
        try:
            meeting = rollcall.meet_and_tell(cfg, name, console.say)
        except rollcall.JoinError as e:
            return _not_started(cfg, console, str(e), keep, trial)
        cfg, watch = rollcall.addressed(cfg, meeting), meeting.watch
    try:
        return _run_nodes(cfg, python, workdir, console, name, watch, trial, keep)
    finally:
        if watch is not None:
            watch.finish()


def _run_nodes(
    cfg: RunConfig,
    python: str,
    workdir: Path,
    console: Console,
    name: str,
    watch,
    trial: int | None,
    keep: Callable[[dict], None] | None,
) -> dict:
    """This host's nodes of the run, started together; their result (node 0's, or the first failure), kept and
    announced (`ended`)."""
    ranks = list(range(cfg.nodes.count)) if cfg.nodes.loopback else [cfg.nodes.rank]
    try:
        (workdir / "runs").mkdir(parents=True, exist_ok=True)
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        nodes = [
            Node(
                cfg.with_nodes(rank=r),
                workdir,
                name + (f".node{r}" if cfg.nodes.count > 1 else ""),
            )
            for r in ranks
        ]
    except (
        OSError
    ) as e:  # a full disk, say: this run fails in one line; the ones that finished are kept
        return _not_started(cfg, console, disk.not_written(workdir, e), keep, trial)
    env = envs.worker_env(
        PYTHONUNBUFFERED="1",
        **({THREADS_ENV: str(cfg.threads)} if cfg.threads else {}),
        **(
            {DEVICES_ENV: str(cfg.devices)}
            if cfg.device_kind == "cpu" and cfg.nodes.count == 1
            else {}
        ),
    )
    # Each run's compile caches in a folder of its own (its nodes share it), inside runs/, which the report
    # does not keep; or the user's shared folder (common/caches.py).
    env = caches.apply(env, cfg.compile_cache, workdir / "runs" / f"{name}.caches")
    if cfg.profile:
        # --profile: the run's traces in the report, traces/<run>/ (every rank and node of this host)
        env[TRACES_ENV] = str(workdir / TRACES / name)

    finished_epochs: list[dict] = []  # what the progress lines reported: kept if the run dies

    def on_line(line: str) -> bool:
        record = progress.parse(line)
        if record is not None:
            console.event(cfg, record)
            deaths.keep_epoch(record, finished_epochs)
            peak.reported(record)
            if watch is not None:
                # the run's progress, for the other hosts' line if this one is lost
                watch.report(record)
        return record is not None

    console.started(cfg)
    oom_before = deaths.oom_kills()
    peak = deaths.PeakRSS()  # the workers' peak resident set, which a SIGKILL is read with
    try:
        exits = launch_all(
            [n.command(python) for n in nodes],
            env,
            [n.log for n in nodes],
            cfg.timeout,
            on_line,
            grace=NODE_GRACE_S,
            failed_grace=FAILED_NODE_GRACE_S,
            lost=watch.lost if watch is not None else None,
            sample=peak.sample,
        )
    except (
        PeerLost
    ) as e:  # this host's workers are stopped: the run fails in the line that names the node
        result = not_run_result(cfg, "failed", str(e))
        result["log"] = f"logs/{nodes[0].log.name}"
        return ended(cfg, result, console, keep, trial)
    except OSError as e:
        what = (
            disk.not_written(e.filename, e)
            if isinstance(e, LogNotWritten)
            else f"could not start {python}: {e}"
        )
        return ended(cfg, not_run_result(cfg, "failed", what), console, keep, trial)
    # The workers have ended: from reading their results until the run's is kept, a stop signal waits (it is
    # raised once the run is kept and announced), or a run that finished would be lost.
    with interrupts.held():
        codes = [code for code, _, _ in exits if code is not None]
        # what the others had
        grace = None if not codes else FAILED_NODE_GRACE_S if any(codes) else NODE_GRACE_S
        oom = (oom_before, deaths.oom_kills(), peak.mb)
        results = [
            n.result(code, output, workdir, grace, oom)
            for n, (code, output, _) in zip(nodes, exits)
        ]
        result = (
            results[0]
            if len(nodes) == 1
            else merge_nodes(cfg, nodes, results, [at for *_, at in exits])
        )
        if watch is not None and result["status"] != "ok" and watch.lost():
            # The engine failed on the lost host just before the heartbeats said so: the line that names the
            # node is the headline (the last line), the engine's own words before it.
            result["error"] = f"{result.get('error') or ''}\n{watch.lost()}".strip()
        deaths.keep_partial_epochs(result, finished_epochs)
        result["log"] = f"logs/{nodes[0].log.name}"
        mllog_path = nodes[0].log.with_suffix(".mllog")
        if mllog.extract(nodes[0].log, mllog_path):
            result["mllog"] = f"logs/{mllog_path.name}"
        result["profile"] = in_report(result.get("profile"), workdir, name)
        return ended(cfg, result, console, keep, trial)


def in_report(profile: dict | None, workdir: Path, name: str) -> dict | None:
    """A run's profile record with its trace named from the report's folder (traces/<run>/...); a trace the worker
    named but that is not there is said instead."""
    if not profile or not profile.get("trace"):
        return profile
    trace = f"{TRACES}/{name}/{profile['trace']}"
    if not (workdir / trace).is_file():
        return {
            **profile,
            "trace": None,
            "error": f"the worker named a trace that is not there ({trace})",
        }
    return {**profile, "trace": trace}


def _not_started(
    cfg: RunConfig,
    console: Console,
    error: str,
    keep: Callable[[dict], None] | None,
    trial: int | None,
) -> dict:
    """The run's failed row when it could not start (the nodes did not meet, a file could not be written): its
    one line, no worker started."""
    console.started(cfg)
    return ended(cfg, not_run_result(cfg, "failed", error), console, keep, trial)


# After one node has ended, how long the others may take to end too before they are killed: a peer's
# collective that lost its partner fails within seconds on gloo, but ps-lite waits for a dead worker forever.
# After a clean end, the others may still be evaluating or writing; after a failure, they can only fail too,
# and a few seconds let them say how (FAILED_GRACE_ENV shortens that wait where the seconds are all the test
# suite's: its nodes killed on purpose).
NODE_GRACE_S = 60.0
FAILED_GRACE_ENV = "DPBENCH_FAILED_NODE_GRACE_S"


def failed_node_grace(env=os.environ, default: float = 10.0) -> float:
    """FAILED_GRACE_ENV's seconds, or `default` where it is unset or not a number of seconds from 0 to the default."""
    try:
        seconds = float(env.get(FAILED_GRACE_ENV, default))
    except ValueError:
        return default
    return seconds if 0 <= seconds <= default else default


FAILED_NODE_GRACE_S = failed_node_grace()


class Node:
    """One node's worker of a run: its config, result and log files."""

    def __init__(self, cfg: RunConfig, workdir: Path, name: str):
        self.cfg = cfg
        self.config_path = workdir / "runs" / f"{name}.config.json"
        self.result_path = workdir / "runs" / f"{name}.result.json"
        self.log = workdir / "logs" / f"{name}.log"
        try:
            cfg.save(self.config_path)
        except OSError as e:  # (a write that fails names no file)
            raise OSError(e.errno, e.strerror, str(self.config_path)) from None

    def command(self, python: str) -> list[str]:
        return [
            python,
            "-m",
            f"backends.{self.cfg.backend}",
            "--config",
            str(self.config_path),
            "--result",
            str(self.result_path),
        ]

    def result(
        self,
        returncode: int | None,
        output: list[str],
        workdir: Path,
        peer_grace: float | None = None,
        oom: tuple[int | None, int | None, float | None] = (None, None, None),
    ) -> dict:
        """The worker's result, or a failed / timeout one with the tail of its output; `peer_grace`: the seconds it
        was given after another node had ended (None: none had); `oom`: the cgroup's out-of-memory kills before
        and after the run (deaths.oom_kills) and the worker's peak resident set in MB (deaths.PeakRSS), what a
        SIGKILL is read with. A device that ran out of memory is said in the error's last line."""
        cfg = self.cfg
        # MLPerf's log lines are records (logs/<run>.mllog), not what went wrong: an error's tail leaves them out
        output = [line for line in output if mllog.MARKER not in line]
        if returncode is None and peer_grace is not None:
            result = failed_result(
                cfg.to_dict(),
                "timeout",
                f"{''.join(output[-20:])}stopped {peer_grace:g} s "
                "after another node had ended (waiting on it)",
            )
        elif returncode is None:
            # The worker's last output first, the reason last: the report's headline is the error's last line.
            result = failed_result(
                cfg.to_dict(),
                "timeout",
                f"{''.join(output[-20:])}killed after --timeout {cfg.timeout:g} s",
            )
        else:
            try:
                result = load_result(self.result_path, cfg.to_dict())
            except (OSError, ValueError) as e:
                reason = f"{deaths.how_it_died(returncode, *oom)} and no valid result ({e})"
                # The report's headline is the error's last line: the worker's own last words if it failed,
                # but the reason itself if it exited 0 (its output then says nothing about what went wrong).
                cause = readable_cause(output)
                # the reason and the cause whole, the output's tail in what the error's length leaves them
                room = max(ERROR_TAIL_CHARS // 4, ERROR_TAIL_CHARS - len(reason) - len(cause) - 8)
                error = (
                    tail("".join(output), room) + "\n" + reason
                    if returncode == 0
                    else reason + "\n" + tail("".join(output), room) + cause
                )
                result = failed_result(cfg.to_dict(), "failed", error)
        if result["status"] == "failed":
            said = deaths.device_out_of_memory(
                f"{result.get('error') or ''}{''.join(output[-50:])}"
            )
            result["error"] = (
                f"{result.get('error') or ''}\n{said}".strip() if said else result.get("error")
            )
        if result.get("error"):
            # Paths in the staging directory as they will be once it is renamed to the report's (runs/..., logs/...)
            result["error"] = result["error"].replace(f"{workdir}{os.sep}", "")
        return result


# A native stack's lines (absl's and glibc's frames, a signal's banner, C++ frames): never a run's headline.
NATIVE_FRAME = re.compile(
    r"^\s*(@\s+0x[0-9a-f]+|PC:\s*@|\*\*\* |#\d+\s+0x|frame #\d+|\[bt\]|\d+\s+0x[0-9a-f]+)",
    re.IGNORECASE,
)
# A line that says what happened: an error, a failed check, a connection closed or refused, a timeout.
SAYS_WHAT = re.compile(
    r"error|failed|fatal|closed|refused|reset by peer|timed out|timeout|abort|terminate|killed",
    re.IGNORECASE,
)


def readable_cause(output: list[str]) -> str:
    """The first line of a dead worker's output that says what happened (the gloo or gRPC error, a failed
    check), as a last line of its own: a worker that dies in native code ends its output with stack frames,
    which must not be the run's headline. "" if no line says."""
    for line in output:
        text = line.strip()
        if "warning" in text.lower() or NATIVE_FRAME.match(text):
            continue
        if SAYS_WHAT.search(text):
            return "\ncause: " + text[:400]
    return ""


def merge_nodes(
    cfg: RunConfig, nodes: list[Node], results: list[dict], ended_at: list[float]
) -> dict:
    """Node 0's result if every node's is ok; else a failed row with the first failing node's error (the
    cause; the others' failures, its echoes, follow in one line each). A node killed after the grace counts
    last: it did not fail, it waited on the one that did."""
    bad = sorted(
        (i for i, r in enumerate(results) if r["status"] != "ok"),
        key=lambda i: (results[i]["status"] == "timeout", ended_at[i]),
    )
    if not bad:
        return results[0]
    first = results[bad[0]]
    rank = nodes[bad[0]].cfg.nodes.rank
    echoes = "".join(
        f"\n(then node {nodes[i].cfg.nodes.rank}: {_last_line(results[i])})" for i in bad[1:]
    )
    # The headline (the last line, which survives the error's tail) names the node that failed first.
    error = f"{first.get('error') or ''}{echoes}\nnode {rank} of {cfg.nodes.count} failed first: {_last_line(first)}"
    status = first["status"] if first["status"] in ("unavailable", "diverged") else "failed"
    return {
        **failed_result(cfg.to_dict(), status, error),
        "environment": results[0].get("environment") or {},
    }


def _last_line(result: dict) -> str:
    """A node's failure in one line: how its process ended if it left no result (killed), else its last words."""
    lines = (result.get("error") or "").strip().splitlines()
    exited = [line for line in lines if line.startswith(deaths.ENDINGS)]
    return f"{result['status']}: {(exited or lines)[-1]}" if lines else result["status"]
