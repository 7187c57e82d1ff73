"""The harness never imports a framework: not in its source, not at run time."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.harness.helpers import ROOT

FRAMEWORKS = {"torch", "jax", "jaxlib", "flax", "optax", "mxnet"}


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_harness_and_common_sources_import_no_framework():
    for folder in ("harness", "common"):
        for path in (ROOT / folder).rglob("*.py"):
            assert not imported_modules(path) & FRAMEWORKS, (
                f"{path.relative_to(ROOT)} imports a framework"
            )


def test_planning_a_full_run_loads_no_framework():
    code = (
        "import sys\n"
        "from harness import arguments, check, cli, report, testing\n"
        "from harness.planning import plan\n"
        "from harness.processes import envs, runner\n"
        "args = cli.build_parser().parse_args(['--backend', 'all', '--gpus', '1,2', '--device', 'cpu', "
        "'--dataset', 'synthetic'])\n"
        "plan = cli.build_plan(args)\n"
        "assert plan.configs, 'nothing planned'\n"
        f"print(sorted(set({sorted(FRAMEWORKS)!r}) & set(m.split('.')[0] for m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
