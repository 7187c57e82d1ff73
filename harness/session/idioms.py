"""The frameworks' idioms in a parity session: each a short training loop written as the framework's own examples
write it (benchmarks/idioms/), run in its own process on the same config as the strategy it stands beside; its
result read as untrusted input; an idiom's trial kept from a resumed report when it finished there."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from common import caches, manifest, sysinfo
from common import weights as weightslib
from common.config import RunConfig
from common.profiling import TRACES_ENV
from common.results import profile_problem
from harness.processes import envs, runner
from harness.session import resume


@dataclass(frozen=True)
class Idiom:
    """A framework's idiomatic loop: its name in the report, its module, the environment it needs."""

    name: str
    module: str
    env: tuple[tuple[str, str], ...] = ()


def idiom_of(cfg: RunConfig) -> Idiom:
    """The loop a strategy is measured against: its framework's idiom, named and run as the strategy's backend.toml
    declares (Keras's ddp against Keras on torch, its distribution against Keras on jax)."""
    declared = manifest.load(cfg.backend).strategies[cfg.strategy]
    return Idiom(declared.idiom, f"benchmarks.idioms.{cfg.backend}", declared.idiom_env)


@dataclass(frozen=True)
class IdiomRun:
    """One trial of an idiom, with the run config whose weights, batches and threads it takes."""

    idiom: Idiom
    cfg: RunConfig


class IdiomFailed(Exception):
    """An idiom's process failed, or wrote a result that is not one; the message says why."""


def run_idiom(job: IdiomRun, trial: int, python: str, workdir: Path) -> dict:
    """One idiom trial's record: its step seconds (status ok), or the reason it has none (status failed)."""
    record = {"idiom": job.idiom.name, "backend": job.cfg.backend, "trial": trial}
    try:
        return {**record, "status": "ok", **measure_idiom(job, trial, python, workdir)}
    except IdiomFailed as e:
        return {**record, "status": "failed", "error": str(e)}


def measure_idiom(job: IdiomRun, trial: int, python: str, workdir: Path) -> dict:
    name = job.idiom.name.replace(" ", "-")
    folder = workdir / "idioms"
    config, result = (
        folder / f"{name}-trial{trial}.json",
        folder / f"{name}-trial{trial}.result.json",
    )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        job.cfg.save(config)
    except OSError as e:
        raise IdiomFailed(f"cannot write its config: {e.strerror or e}") from None
    cmd = [python, "-m", job.idiom.module, "--config", str(config), "--result", str(result)]
    # the strategies' rule for compile caches: cold, or the shared folder
    env = caches.apply(
        idiom_env(job), job.cfg.compile_cache, folder / f"{name}-trial{trial}.caches"
    )
    traces = f"idiom-{name}-trial{trial}"
    if job.cfg.profile:
        env[TRACES_ENV] = str(workdir / runner.TRACES / traces)
    try:
        code, output = runner.launch(
            cmd,
            env,
            workdir / "logs" / f"idiom-{name}-trial{trial}.log",
            job.cfg.timeout,
        )
    except OSError as e:
        raise IdiomFailed(f"could not start {python}: {e}") from None
    if code != 0:
        ended = f"timed out after {job.cfg.timeout:g} s" if code is None else f"exited {code}"
        raise IdiomFailed(f"{ended}: {''.join(output[-3:]).strip()[-400:]}")
    record = checked_result(result, job.cfg)
    return {
        **record,
        "profile": runner.in_report(record["profile"], workdir, traces),
    }


def idiom_env(job: IdiomRun) -> dict:
    """The worker's environment, with the run's threads where torch and MXNet read them (at their import):
    --threads, else every usable core, as the suite's one-process runs take (MXNet's own default is fewer)."""
    threads = str(job.cfg.threads or sysinfo.usable_cpus())
    return envs.worker_env(PYTHONUNBUFFERED="1", OMP_NUM_THREADS=threads, **dict(job.idiom.env))


def checked_result(path: Path, cfg: RunConfig) -> dict:
    """The idiom's result file, read as untrusted input: its framework, warm-up and step seconds, checked
    against the run it stands beside (the same initial weights, as many steps)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise IdiomFailed(f"its result {path.name} cannot be read: {e}") from None
    steps = doc.get("steps_s") if isinstance(doc, dict) else None
    if not isinstance(steps, list) or len(steps) != cfg.timed_steps or not all(map(seconds, steps)):
        raise IdiomFailed(f"its result holds no {cfg.timed_steps} step times (steps_s)")
    if doc.get("weights_hash") != weightslib.fingerprint(weightslib.for_run(cfg)):
        raise IdiomFailed("it did not start from the run's canonical weights (weights_hash)")
    if not isinstance(doc.get("framework"), str) or not seconds(doc.get("warmup_s")):
        raise IdiomFailed("its result lacks its framework or warm-up time")
    profile = doc.get("profile")
    problem = profile_problem(profile) if isinstance(profile, dict) else "not an object"
    if profile is not None and problem:
        # the timed steps stand; a profile that is not one is dropped, with the reason
        profile = {"error": f"its profile is not one: {problem}"}
    return {
        "framework": doc["framework"][:80],
        "warmup_s": doc["warmup_s"],
        "steps_s": steps,
        "profile": profile,
    }


def seconds(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def kept_idiom(
    job: IdiomRun, trial: int, earlier: resume.Earlier | None, workdir: Path, say
) -> dict | None:
    """The idiom's trial from the report resumed, its log and trace copied into this one, if it finished there
    with the step times this run's trial would have (read as untrusted input: otherwise it runs again)."""
    record = earlier.kept_idiom(job.idiom.name, job.cfg.backend, trial) if earlier else None
    if record is None or not finished_steps(record, job.cfg):
        return None
    name = job.idiom.name.replace(" ", "-")
    problem = resume.copy_records(
        {"log": f"logs/idiom-{name}-trial{trial}.log", "profile": record.get("profile")},
        earlier,
        workdir,
    )
    say(
        f"idiom {job.idiom.name} trial {trial} kept from {earlier.folder}: finished there"
        + (f" ({problem})" if problem else "")
    )
    return record


def finished_steps(record: dict, cfg: RunConfig) -> bool:
    steps = record.get("steps_s")
    return (
        isinstance(steps, list)
        and len(steps) == cfg.timed_steps
        and all(map(seconds, steps))
        and isinstance(record.get("framework"), str)
    )


def failed_idiom(job: IdiomRun, trial: int, error: str) -> dict:
    return {
        "idiom": job.idiom.name,
        "backend": job.cfg.backend,
        "trial": trial,
        "status": "failed",
        "error": error,
    }


def announce(console: runner.Console, record: dict) -> dict:
    if record["status"] == "ok":
        step = statistics.median(record["steps_s"])
        console.say(
            f"idiom {record['idiom']} trial {record['trial']}: median step {step * 1000:.1f} ms"
        )
    else:
        console.say(f"idiom {record['idiom']} trial {record['trial']}: failed: {record['error']}")
    return record
