"""--resume REPORT_DIR: a report taken up again by the command that made it (`run`, or `parity`). The report's own
command is planned again; every run that finished there (the same configuration and trial) is kept as it is, its log
and trace with it, and so is every idiom trial parity finished; only the runs that did not finish, or never started,
run now; and the new report, one document with all of them, says it resumed which report and when. The report is
untrusted input: one that cannot be read, that another command made, or that other code made (another version or
commit, or uncommitted changes on one side only) is refused in one line. A report is data, not a program: its
command goes through the parser and refusals a typed one does, and names no interpreter to run (its `--python` is
dropped: the checkout's own environments run it, or the `--python` typed with `--resume`); a kept run is one whose
record holds its figures."""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import math
import os
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from common.config import RunConfig
from common.results import load_results_json
from harness.errors import UsageError
from harness.processes import runner
from harness.reporting import leftovers, provenance

# What a resumed run keeps: a run that ended with figures (or with a verdict on its math), not one that failed,
# ran out of time or was interrupted.
KEPT = ("ok", "diverged")
COMMAND = "python -m harness"


@dataclass(frozen=True)
class Earlier:
    """The report a run resumes: its folder, its command's words after `python -m harness`, its results by
    (configuration, trial), and its equivalence check where it finished one."""

    folder: Path
    argv: list[str]
    results: dict[tuple[str, int | None], dict]
    equivalence: dict | None
    provenance: dict | None
    idioms: tuple[dict, ...] = ()  # parity's idiom trials that finished there
    # lines said once it is taken up: each run recorded as finished but not kept, its command's --python dropped
    said: list[str] = field(default_factory=list)

    def kept(self, cfg: RunConfig, trial: int | None) -> dict | None:
        return self.results.get(run_key(cfg.to_dict(), trial))

    def kept_idiom(self, idiom: str, backend: str, trial: int) -> dict | None:
        """The idiom's trial as parity recorded it there (read as untrusted: its caller checks its steps)."""
        for record in self.idioms:
            if (record.get("idiom"), record.get("backend"), record.get("trial")) == (
                idiom,
                backend,
                trial,
            ):
                return record
        return None


def run_key(config: dict, trial: int | None) -> tuple[str, int | None]:
    return json.dumps(config, sort_keys=True), trial


def only_flag(argv: list[str], command: str, folder: str) -> None:
    """--resume takes the report's own command: `command --resume REPORT_DIR` with --quiet and --python at most."""
    given, words = [], iter(argv)
    for a in words:
        if a == "--python":
            next(words, None)
        elif a not in (command, "--quiet") and not a.startswith(("--resume", "--python=")):
            given.append(a)
    if given[1:] or (given and os.path.abspath(given[0]) != folder):
        raise UsageError(
            "--resume takes the report's own command: give no other flag than --quiet or --python NAME=PATH"
        )


def parse(
    earlier: Earlier, parser: argparse.ArgumentParser, words: list[str], typed
) -> argparse.Namespace:
    """The report's command (`words`) parsed as a typed one, refused in one line where it does not parse; its
    `--python` dropped (said in one line) for the one typed with --resume (`typed.python`): a report names no
    interpreter to run."""
    try:
        flags = parser.parse_args(words)
    except UsageError as e:
        raise UsageError(f"--resume {earlier.folder}: its command does not parse: {e}") from None
    if flags.python:
        instead = "the --python given here" if typed.python else "the checkout's own environments"
        earlier.said.append(
            f"--resume {earlier.folder}: its command's --python is not taken from a report: {instead} run it"
        )
    flags.python = list(typed.python)
    return flags


def read(folder: str, command: str = "run") -> Earlier:
    """The report in `folder` (its results.json) that `command` made, or a UsageError saying why it cannot be
    resumed."""
    path = Path(folder)
    if path.name.startswith(".tmp-") and path.is_dir():
        raise UsageError(staging_refusal(path))
    try:
        runs, meta = load_results_json(str(path / "results.json"))
    except (OSError, ValueError) as e:
        raise UsageError(f"--resume {folder}: not a report this harness can read ({e})") from None
    line = str(meta.get("command") or "")
    if not line.startswith(COMMAND + " ") and line != COMMAND:
        raise UsageError(f"--resume {folder}: its command is not a run of {COMMAND} ({line!r})")
    try:
        argv = shlex.split(line)[3:]
    except ValueError as e:
        raise UsageError(f"--resume {folder}: its command does not parse ({e})") from None
    theirs = argv[0] if argv and not argv[0].startswith("-") else "run"
    if theirs != command:
        raise UsageError(
            f"--resume {folder}: a report of `{theirs}`; take it up with `{COMMAND} {theirs} --resume {folder}`"
        )
    results, dropped = {}, []
    for r in runs:
        record = r.to_dict()
        problem = figures_problem(record) if r.status in KEPT else "not finished"
        if problem is None:
            results[run_key(r.config.to_dict(), r.trial)] = record
        elif r.status in KEPT:
            trial = f" trial {r.trial}" if r.trial else ""
            dropped.append(
                f"[{runner.label(r.config)}{trial}] not kept from {folder}: {problem}; it runs again"
            )
    check = meta.get("equivalence")
    finished_check = check if isinstance(check, dict) and check.get("rows") is not None else None
    return Earlier(
        path,
        argv,
        results,
        finished_check,
        meta.get("provenance"),
        finished_idioms(meta),
        dropped,
    )


def staging_refusal(path: Path) -> str:
    """Why a staging folder is not resumed, and what takes it up: its harness's own report when it ends, or, when it
    was killed, the next run with the same --out, which keeps it as a report that can be resumed."""
    out, run_id = path.parent, path.name[len(".tmp-") :]
    if not leftovers.abandoned(path):
        return (
            f"--resume {path}: the staging folder of a harness still running, not a report: it becomes "
            f"{out / run_id} when that harness ends (resume that one if it was cut off)"
        )
    return (
        f"--resume {path}: the staging folder of a killed harness, not a report: the next run with --out {out} "
        f"keeps it as {out / run_id}-killed, a report of its finished runs; resume that one"
    )


# The reports this process is resuming (held once, however many callers ask: a second flock of this process's
# would refuse the process itself).
HELD: set[str] = set()


@contextlib.contextmanager
def one_at_a_time(folder: Path):
    """Inside, this process is the one resuming `folder`: a lock on the folder itself (flock, which the kernel
    drops with its holder, killed or not), or a UsageError saying another resume of it is running. A file system
    without locks resumes unguarded."""
    name = os.path.realpath(folder)
    if name in HELD:
        yield
        return
    try:
        fd = os.open(name, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise UsageError(
                    f"--resume {folder}: another resume of it is running: one at a time"
                ) from None
        HELD.add(name)
        yield
    finally:
        HELD.discard(name)
        os.close(fd)


def nothing_left(
    earlier: Earlier, planned: list[tuple[RunConfig, int | None]], check: bool
) -> bool:
    """Whether every planned run finished there (and the check, where the command has one): a resume would only
    write the report again."""
    return all(earlier.kept(cfg, trial) is not None for cfg, trial in planned) and (
        not check or earlier.equivalence is not None
    )


def figures_problem(record: dict) -> str | None:
    """Why a run recorded as ok does not hold its figures (its final test accuracy, and its epochs unless it
    trained none), or None: a status edited to ok keeps no run."""
    if record.get("status") != "ok":
        return None
    accuracy = record.get("final_test_acc")
    if (
        isinstance(accuracy, bool)
        or not isinstance(accuracy, (int, float))
        or not math.isfinite(accuracy)
    ):
        return "recorded as ok without its final test accuracy"
    if not record.get("epochs") and (record.get("config") or {}).get("epochs") != 0:
        return "recorded as ok without its epochs"
    return None


def finished_idioms(meta: dict) -> tuple[dict, ...]:
    """parity's idiom trials that finished, as results.json's "parity" holds them (none where it holds none)."""
    figures = meta.get("parity")
    idioms = figures.get("idioms") if isinstance(figures, dict) else None
    if not isinstance(idioms, list):
        return ()
    return tuple(i for i in idioms if isinstance(i, dict) and i.get("status") == "ok")


def check_code(earlier: Earlier, now: dict) -> list[str]:
    """Refuses (UsageError) a report other code made: another version or commit, or uncommitted changes on one side
    only; the lines to say otherwise (Earlier.said; the host it was made on, where it was another; uncommitted
    changes on both sides, which cannot be compared)."""
    then = provenance.known(earlier.provenance)
    if then is None:
        raise UsageError(f"--resume {earlier.folder}: it does not record the code that made it")
    differs = [
        f"{what} {then.get(key)} then, {now.get(key)} now"
        for key, what in (("version", "dpbench"), ("commit", "commit"))
        if then.get(key) != now.get(key)
    ]
    if bool(then.get("uncommitted_changes")) != bool(now.get("uncommitted_changes")):
        differs.append("uncommitted changes on one side only")
    if differs:
        raise UsageError(f"--resume {earlier.folder}: other code made it ({'; '.join(differs)})")
    said = list(earlier.said)
    if then.get("uncommitted_changes"):
        said.append("Resuming over uncommitted changes on both sides: they are not compared")
    if then.get("host") != now.get("host"):
        said.append(f"Resuming a report made on {then.get('host')} here on {now.get('host')}")
    return said


def check_configurations(earlier: Earlier, planned: list[tuple[RunConfig, int | None]]) -> None:
    """Every run the report kept must be one the command plans again (the same configuration): otherwise what the
    command plans here is not what it planned there (another device, data, default), and it is refused."""
    again = {run_key(cfg.to_dict(), trial) for cfg, trial in planned}
    strays = [key for key in earlier.results if key not in again]
    if strays:
        config = json.loads(strays[0][0])
        raise UsageError(
            f"--resume {earlier.folder}: its command plans other runs here ({len(strays)} finished run(s) "
            f"there, e.g. {config.get('backend')} {config.get('strategy')} x{config.get('devices')}, are not "
            "planned again): the configuration differs"
        )


def copy_records(result: dict, earlier: Earlier, workdir: Path) -> str | None:
    """A kept run's log, MLPerf log and trace folder, copied from the earlier report into the new one, where the
    result names them (names read as untrusted: only plain files and folders under logs/ and traces/). A copy that
    fails (a full disk) is said, in words, and the run stays kept: its record is what counts."""
    try:
        copy_named(result, earlier, workdir)
    except OSError as e:
        return f"its log could not be copied: {e.strerror or e}"
    return None


def copy_named(result: dict, earlier: Earlier, workdir: Path) -> None:
    named = [result.get("log"), result.get("mllog")]
    trace = (
        (result.get("profile") or {}).get("trace")
        if isinstance(result.get("profile"), dict)
        else None
    )
    named.append(str(Path(trace).parent) if isinstance(trace, str) else None)
    for name in named:
        if not isinstance(name, str) or not inside_report(name):
            continue
        source, target = earlier.folder / name, workdir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir() and not source.is_symlink():
            shutil.copytree(source, target, dirs_exist_ok=True, symlinks=True)
        elif source.is_file() and not source.is_symlink():
            shutil.copy2(source, target)


def inside_report(name: str) -> bool:
    parts = Path(name).parts
    return (
        len(parts) >= 2
        and parts[0] in ("logs", "traces")
        and ".." not in parts
        and not Path(name).is_absolute()
    )
