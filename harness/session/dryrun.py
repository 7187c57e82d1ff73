"""`--dry-run` (session/__init__.py): what a session would do, said without doing it: the devices, every run in
the order it would start, every refusal with its reason, what `--best` switches on per backend, and the environment
each backend would use (built on first use). Nothing is trained and no environment is built."""

from __future__ import annotations

from harness.planning.plan import Devices, Plan
from harness.planning.request import RunRequest
from harness.processes import devices, envs, runner


def dry_run(plan: Plan, request: RunRequest) -> list[str]:
    """--dry-run: the devices, every run in the order it would start, every refusal with its reason, and the
    environments each backend would use (built on first use)."""
    lines = [
        "Dry run: nothing is trained and no environment is built.",
        Devices(plan.device_kind, plan.gpus, plan.detection).line,
    ]
    if plan.topology.how:
        lines.append(f"Nodes: {plan.topology.how}")
    lines.append(f"Preset: {plan.preset}")
    lines.append(f"Would run {len(plan.runs)} run(s), in this order:")
    for cfg, trial in plan.runs:
        lines.append(f"  {run_line(cfg, trial)}")
    if plan.not_run:
        lines.append("Would not run:")
        lines += [f"  {runner.label(cfg)}: {reason}" for cfg, reason in plan.not_run]
    lines += best_lines(plan)
    if request.each_run.check:
        lines.append(
            "Before them, the equivalence check of these configurations (--no-check skips it)."
        )
    for name in sorted(plan.backends):
        lines.append(f"Environment of {name}: {environment_line(name, plan)}")
    return lines


def best_lines(plan: Plan) -> list[str]:
    """--best: what it switched on for each backend, or that its best is its default (one row), and why."""
    if not plan.best:
        return []
    return ["--best (each backend.toml's [best]):"] + [f"  {note}" for note in plan.best.values()]


def run_line(cfg, trial: int | None) -> str:
    target = f", stop at test accuracy {cfg.target_accuracy:g}" if cfg.target_accuracy else ""
    return (
        f"{runner.label(cfg)}{f' trial {trial}' if trial else ''}: {cfg.model}, batch {cfg.batch_size}, "
        f"lr {cfg.lr:g}, {cfg.epochs} epoch(s){target}, train {cfg.train_size or 'all'} / test "
        f"{cfg.test_size or 'all'} images"
    )


def environment_line(name: str, plan: Plan) -> str:
    if name in plan.pythons:
        return f"{plan.pythons[name]} (--python)"
    requirements = envs.requirements_for(plan.backends[name].requirements, devices.driver_version())
    where = (envs.VENVS / name).relative_to(envs.ROOT)
    state = "ready" if envs.is_current(name, requirements) else "would be built on first use"
    return f"{where} from {requirements.relative_to(envs.ROOT)} ({state})"
