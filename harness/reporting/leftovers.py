"""What a killed harness left in --out: its staging directory `.tmp-<run-id>`, found by the next run.

A harness killed with SIGKILL (or by the machine's out-of-memory killer) cannot clean up: its workers end with
it (common/worker.py's lifeline), but its staging directory stays, holding the runs that had finished (each
`runs/<name>.result.json`), every run's config and its workers' logs. Those are results the user paid for,
so the next run with the same --out keeps them, as a report: it writes report.md and results.json from the
finished runs (read as the untrusted files they are) and renames the directory `<run-id>-killed`, beside the
complete reports, and says so in one line. A directory with no finished run is kept the same way, for its
logs. A staging directory whose owner is still running (another harness sharing --out) is left alone.

Each staging directory names its owner in `owner.json`: the process id and its start time, since a process id
alone may be reused by a later process.

What the session keeps is on disk as it keeps it, so that a kill at any instant loses no finished run: each run's
record, as the report will hold it (its log and MLPerf log named), in `runs/NNNN.record.json` (NNNN its place in the
plan), written when the run is kept; a resume's kept runs, all at once before anything else runs (`runs/` made whole
by one rename); and the run that is training, as the interrupted row it becomes if the harness dies, in
`runs/running.json`. A worker's own `runs/<name>.result.json` stands in for a record the kill cut off.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from common.files import write_json_atomic
from common.results import load_result, result_problem

OWNER = "owner.json"
META = "meta.json"
# A staging directory without a readable owner file (a harness of an older version, or one killed between
# mkdir and the owner's write) is taken as left behind once it is this old.
UNOWNED_AGE_S = 3600.0
RUNS = "runs"
RUNNING = "running.json"
# What a killed harness's report says of it: in its header (the report's `finished`) and its meta (`killed`).
KILLED = "the harness was killed"


def record_name(index: int) -> str:
    return f"{index:04d}.record.json"


def stage_record(staging: Path, index: int, record: dict) -> None:
    """A kept run's record, the `index`-th of the plan, on disk; the run that was training no longer is."""
    write_json_atomic(staging / RUNS / record_name(index), record)
    (staging / RUNS / RUNNING).unlink(missing_ok=True)


def stage_records(staging: Path, records: dict[int, dict]) -> None:
    """A resume's kept runs on disk at once, before any other: `runs/` made whole in a folder beside it and renamed
    into place, so a kill finds all of them or none (and then the report resumed still holds them)."""
    runs = staging / RUNS
    if runs.exists():  # (not made by a session that stages first)
        for index, record in records.items():
            write_json_atomic(runs / record_name(index), record)
        return
    making = staging / f".{RUNS}-staged"
    making.mkdir(exist_ok=True)
    for index, record in records.items():
        write_json_atomic(making / record_name(index), record)
    making.rename(runs)


def stage_running(staging: Path, row: dict) -> None:
    """The run now training, as the row a killed harness's report gives it (`row`, an interrupted one)."""
    (staging / RUNS).mkdir(exist_ok=True)
    write_json_atomic(staging / RUNS / RUNNING, row)


def claim(staging: Path) -> None:
    """Name this process as the owner of `staging`."""
    write_json_atomic(staging / OWNER, {"pid": os.getpid(), "started": process_start(os.getpid())})


def process_start(pid: int) -> str | None:
    """When process `pid` started, in clock ticks since boot (/proc/<pid>/stat field 22); None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[
        19
    ]  # (the command name, in parentheses, may hold spaces)


def abandoned(staging: Path) -> bool:
    """Whether `staging`'s owner is gone (or unknown, and the directory old)."""
    try:
        owner = json.loads((staging / OWNER).read_text())
        pid, started = int(owner["pid"]), owner["started"]
    except (OSError, ValueError, KeyError, TypeError):
        try:
            return time.time() - staging.stat().st_mtime > UNOWNED_AGE_S
        except OSError:
            return False
    return process_start(pid) != started


def keep_left_behind(out: Path, write_report) -> list[str]:
    """Turn every abandoned staging directory in `out` into `<run-id>-killed` (with a report of its finished
    runs, written by `write_report(directory, results, meta)`); one line per directory, to print."""
    try:
        found = sorted(p for p in out.glob(".tmp-*") if p.is_dir()) if out.is_dir() else []
    except OSError:
        return []  # an --out that cannot be read: creating the report's folder there says why, in one line
    return [_keep(out, staging, write_report) for staging in found if abandoned(staging)]


def _keep(out: Path, staging: Path, write_report) -> str:
    run_id = staging.name[len(".tmp-") :]
    results = finished_results(staging)
    done = sum(r.get("status") != "interrupted" for r in results)
    reported = ""
    try:
        meta = json.loads((staging / META).read_text())
    except (OSError, ValueError):
        meta = None
    if results:
        try:
            if not isinstance(meta, dict):
                raise ValueError("meta.json is not an object")
            found = time.strftime("%Y-%m-%d %H:%M:%S %Z")
            killed = {"found": found, "by": "the next run with its --out"}
            write_report(
                staging,
                results,
                {
                    **meta,
                    "run_id": run_id,
                    "finished": f"never: {KILLED} (found at {found} by the next run with its --out)",
                    "killed": killed,
                },
            )
            reported = f", with the report of its {done} finished run(s)"
        except (
            Exception
        ) as e:  # meta.json is untrusted: whatever it breaks, the finished results stay in runs/
            reported = f" ({done} finished run(s) in runs/; no report: {type(e).__name__}: {e})"
    resumed = meta.get("resumed") if isinstance(meta, dict) else None
    if not results and isinstance(resumed, dict) and resumed.get("from"):
        # killed before its kept runs were staged: the report it resumed still holds them
        reported = f" (its logs; no run had finished: resume {resumed['from']} instead)"
    final = out / f"{run_id}-killed"
    n = 2
    while final.exists():
        final, n = out / f"{run_id}-killed-{n}", n + 1
    try:
        staging.rename(final)
    except OSError as e:
        return f"harness: found {staging}, left by a killed harness, and could not keep it: {e.strerror or e}"
    return (
        f"harness: the run {run_id} was killed before it finished; kept as {final}"
        f"{reported or ' (its logs; no run had finished)'}"
    )


def finished_results(staging: Path) -> list[dict]:
    """The runs that finished, in plan order: each record the session kept (`runs/NNNN.record.json`), then each
    worker's result without one (node 0's file of each: loopback nodes leave one per node; its log and MLPerf log
    named where they are there), then the run that was training as an interrupted row. A file that is not a valid
    result (cut short by the kill, or altered) is left out."""
    results, seen = [], set()
    runs = staging / RUNS
    for path in sorted(runs.glob("[0-9]*.record.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if result_problem(record) is None:
            results.append(record)
            seen.add(key(record))
    try:
        paths = sorted(runs.glob("*.result.json"), key=lambda p: p.stat().st_mtime)
    except OSError:
        paths = []
    for path in paths:
        if re.search(r"\.node[1-9]\d*\.result\.json$", path.name) or path.name.endswith(
            ".record.json"
        ):
            continue
        try:
            config = json.loads(
                path.with_name(path.name.replace(".result.json", ".config.json")).read_text()
            )
            result = load_result(path, config)
        except (OSError, ValueError, TypeError):
            continue
        name = re.sub(r"\.node0$", "", path.name[: -len(".result.json")])
        trial = re.search(r"-trial(\d+)(-|$)", name)
        if trial:
            result["trial"] = int(trial.group(1))
        if key(result) in seen:
            continue
        for field, suffix in (("log", ".log"), ("mllog", ".mllog")):
            log = f"logs/{path.name[: -len('.result.json')]}{suffix}"
            if (staging / log).is_file():
                result[field] = log
        results.append(result)
        seen.add(key(result))
    try:
        running = json.loads((runs / RUNNING).read_text())
    except (OSError, ValueError):
        running = None
    if running is not None and result_problem(running) is None and key(running) not in seen:
        results.append(running)
    return results


def key(record: dict) -> tuple[str, object]:
    """A run's configuration and trial: which run of the plan a record is."""
    return json.dumps(record.get("config"), sort_keys=True), record.get("trial")
