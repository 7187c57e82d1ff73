"""Why a strategy's step is slower than its framework's idiom's, read off the two sides' `--profile` breakdowns:
what `parity` writes beside a row it has no measured reason for, and what `report --reread-traces` writes again
once the breakdowns are re-read from their traces."""

from __future__ import annotations

import math

from common.profiling import CATEGORIES, step_seconds
from common.results import Result
from harness.reporting.tables import milliseconds

# The categories with the most extra time a reason names.
REASONS = 2


def profiled_pair(
    suite: list[Result], idioms: list[dict], suite_step: float, idiom_step: float
) -> tuple[dict, dict] | None:
    """The strategy's and its idiom's profiled step (seconds per category), from their first profiled trials, each
    against its median timed step (a GPU's idle time: common/profiling.py step_seconds); None unless both have
    one."""
    mine = next((r.profile for r in suite if r.ok and r.profile and r.profile.get("seconds")), None)
    theirs = next(
        (
            i["profile"]
            for i in idioms
            if isinstance(i.get("profile"), dict) and i["profile"].get("seconds")
        ),
        None,
    )
    if not (mine and theirs):
        return None
    return step_seconds(mine, suite_step), step_seconds(theirs, idiom_step)


# How a reason read off the two breakdowns begins (breakdown_reason), unlike a known one (KNOWN_COSTS).
PROFILED = "profiled (docs/profiling.md): "


def breakdown_reason(mine: dict, theirs: dict) -> str:
    """Where the strategy's profiled step spends more than its idiom's: the categories with the most extra time. A
    profiled step no longer than the idiom's does not show the difference the trials measure, and says so: its
    steps are a few, from the first trial only."""
    total = sum(mine.values()) - sum(theirs.values())
    if total <= 0:
        return (
            f"{PROFILED}its profiled step is not longer than its idiom's "
            f"({milliseconds(sum(mine.values()))} vs {milliseconds(sum(theirs.values()))} ms): the first "
            "trial's profiled steps do not show the difference the trials measure"
        )
    extra = {k: mine.get(k, 0.0) - theirs.get(k, 0.0) for k in CATEGORIES}
    larger = sorted(((v, k) for k, v in extra.items() if v > 0), reverse=True)[:REASONS]
    where = ", ".join(f"{CATEGORIES[k]} +{milliseconds(v)} ms" for v, k in larger)
    return f"{PROFILED}a step takes +{milliseconds(total)} ms against its idiom's; more in {where}"


def reread_breakdowns(parity: dict, results: list[Result]) -> list[str]:
    """A stored parity's rows given the breakdowns (and the reasons read off them) of its runs' and idioms'
    profiles, once those are re-read from their traces (`harness report --reread-traces`); a known reason, the
    figures and the verdict stay as they are. A row whose profiles give no breakdown now, or one that is not
    finite seconds, keeps its stored breakdown and reason: a line each says why (a report is never made worse by
    reading it again)."""
    kept = []
    for r in parity.get("rows") or []:
        if not isinstance(r, dict) or "suite_step_s" not in r:
            continue  # not measured: no breakdown
        suite = [
            x
            for x in results
            if (x.config.backend, x.config.variant) == (r.get("backend"), r.get("strategy"))
        ]
        idioms = [
            i
            for i in parity.get("idioms") or []
            if isinstance(i, dict) and i.get("idiom") == r.get("idiom")
        ]
        try:
            pair = profiled_pair(suite, idioms, r["suite_step_s"], r.get("idiom_step_s"))
            problem = pair and unfinite(pair)
        except (TypeError, ValueError, AttributeError) as e:
            pair, problem = None, f"its profiles are not tables of seconds ({e})"
        if pair is None and r.get("breakdown") and not problem:
            problem = "its profiles give no breakdown now"
        if problem:
            name = (
                f"parity {r.get('backend')} {r.get('strategy')} against its idiom {r.get('idiom')}"
            )
            kept.append(f"{name}: {problem}; its stored breakdown kept")
            continue
        r["breakdown"] = pair and {"strategy": pair[0], "idiom": pair[1]}
        if pair and str(r.get("reason") or "").startswith(PROFILED):
            r["reason"] = breakdown_reason(*pair)
    return kept


def unfinite(pair: tuple[dict, dict]) -> str | None:
    """Why a profiled pair is not one a report can hold (a category whose seconds are not a finite number), or
    None."""
    for side, seconds in zip(("strategy", "idiom"), pair):
        for key, value in seconds.items():
            if not _number(value):
                return f"its {side}'s {key} seconds are not a finite number ({value!r})"
    return None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
