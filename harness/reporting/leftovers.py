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
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from common.files import write_json_atomic
from common.results import load_result

OWNER = "owner.json"
META = "meta.json"
# A staging directory without a readable owner file (a harness of an older version, or one killed between
# mkdir and the owner's write) is taken as left behind once it is this old.
UNOWNED_AGE_S = 3600.0


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
    reported = ""
    if results:
        try:
            meta = json.loads((staging / META).read_text())
            if not isinstance(meta, dict):
                raise ValueError("not an object")
            write_report(staging, results, {**meta, "run_id": run_id})
            reported = f", with the report of its {len(results)} finished run(s)"
        except (
            Exception
        ) as e:  # meta.json is untrusted: whatever it breaks, the finished results stay in runs/
            reported = (
                f" ({len(results)} finished run(s) in runs/; no report: {type(e).__name__}: {e})"
            )
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
    """The runs that finished, node 0's file of each (loopback nodes leave one per node), in the order they ran.
    A file that is not a valid result (cut short by the kill, or altered) is left out."""
    results = []
    paths = sorted((staging / "runs").glob("*.result.json"), key=lambda p: p.stat().st_mtime)
    for path in paths:
        if re.search(r"\.node[1-9]\d*\.result\.json$", path.name):
            continue
        try:
            config = json.loads(
                path.with_name(path.name.replace(".result.json", ".config.json")).read_text()
            )
            results.append(load_result(path, config))
        except (OSError, ValueError, TypeError):
            continue
    return results
