"""Import contracts (pyproject.toml [tool.importlinter], checked by import-linter's `lint-imports`): the harness and
common never import a framework, backends never import the harness or each other (but keras, which imports torch's
launcher; no backend imports keras; jax and keras share backends/xla.py, which imports neither), common imports
neither, and the harness's modules have no import cycle.
Function-level imports count: a cycle hidden in a function is a cycle."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib

from tests.harness.helpers import ROOT

CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS = [contract["name"] for contract in CONFIG["contracts"]]
# `lint-imports` with this interpreter (the harness's environment: import-linter is pinned in its requirements.txt)
LINT_IMPORTS = [
    sys.executable,
    "-c",
    "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())",
]


def lint_imports(*args, cwd=ROOT, path=ROOT) -> subprocess.CompletedProcess:
    assert importlib.util.find_spec("importlinter"), (
        "import-linter is missing: pip install -r harness/requirements.txt"
    )
    env = {**os.environ, "PYTHONPATH": str(path), "NO_COLOR": "1"}
    return subprocess.run(
        [*LINT_IMPORTS, "--no-cache", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_import_contracts_hold():
    out = lint_imports()
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
    assert len(CONTRACTS) == 17
    for name in CONTRACTS:
        assert f"{name} KEPT" in out.stdout, name


def test_a_cycle_hidden_in_a_function_breaks_the_contract(tmp_path):
    """Module a imports b at the top, b imports a inside a function only: still a cycle."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg import b\n")
    (tmp_path / "pkg" / "b.py").write_text("def later():\n    from pkg import a\n    return a\n")
    (tmp_path / "pkg" / "c.py").write_text("from pkg import a\n")
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\nroot_package = pkg\n\n"
        "[importlinter:contract:acyclic]\nname = pkg has no cycle\n"
        "type = acyclic_siblings\nancestors = pkg\n"
    )
    out = lint_imports("--config", str(tmp_path / ".importlinter"), cwd=tmp_path, path=tmp_path)
    assert out.returncode == 1 and "pkg has no cycle BROKEN" in out.stdout, (
        out.stdout[-3000:] + out.stderr
    )
    assert "No cycles are allowed in pkg." in out.stdout
    # the import to remove: the one inside the function
    assert "- .b -> .a (1 import)" in out.stdout


def test_the_contracts_would_catch_the_old_cli_check_testing_cycle(tmp_path):
    """The cycle the harness had: cli imported check and testing, which imported cli's helpers inside functions.
    Put it back into a copy of the harness and the project's own contracts fail, naming it; so do torch's launcher
    importing its strategies again, a framework imported inside a function of the report, the report resuming a
    report, the test command starting processes itself, a backend importing another and an idiom borrowing a
    backend's code."""
    shutil.copytree(
        ROOT / "harness", tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("common", "backends", "benchmarks", "profilers"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    cli = (tmp_path / "harness" / "cli.py").read_text()
    assert "check" in cli and "testing" in cli  # cli still uses both (at the top or in a function)
    for name in ("check", "testing"):
        with open(tmp_path / "harness" / f"{name}.py", "a") as f:
            f.write("\n\ndef _old_cycle():\n    from harness.cli import main\n    return main\n")
    with open(tmp_path / "harness" / "report.py", "a") as f:
        f.write("\n\ndef _gpu_memory():\n    import torch\n    return torch\n")
        # a reader resuming a report itself
        f.write("\n\ndef _resumed():\n    from harness.session import resume\n    return resume\n")
    # the test command holding its engine, as it did before harness/suites/
    with open(tmp_path / "harness" / "testing.py", "a") as f:
        f.write(
            "\n\ndef _old_engine():\n    from harness.processes import runner\n    return runner\n"
        )
    # how history judged before harness/reporting/comparison.py
    with open(tmp_path / "harness" / "history.py", "a") as f:
        f.write("\n\ndef _old_judge():\n    from harness import compare\n    return compare\n")
    with open(
        tmp_path / "benchmarks" / "idioms" / "jax.py", "a"
    ) as f:  # an idiom borrowing the suite's code
        f.write("\n\ndef _borrowed():\n    from backends.jax import models\n    return models\n")
    with open(tmp_path / "backends" / "jax" / "models.py", "a") as f:
        f.write("\n\ndef _borrowed():\n    from backends.torch import models\n    return models\n")
    with open(
        tmp_path / "backends" / "torch" / "distributed.py", "a"
    ) as f:  # the circle the rank jobs made when they lived in strategies.py
        f.write(
            "\n\ndef _old_jobs():\n    from backends.torch.strategies import TRAINERS\n    return TRAINERS\n"
        )
    out = lint_imports(cwd=tmp_path, path=tmp_path)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr
    assert "harness and common never import a framework BROKEN" in out.stdout
    assert "harness.report -> torch" in out.stdout
    assert "no backend imports another BROKEN" in out.stdout
    assert "no subcommand imports another BROKEN" in out.stdout
    assert "harness.history -> harness.compare" in out.stdout
    assert "backends never import the harness KEPT" in out.stdout
    assert "the idioms import no backend and no harness BROKEN" in out.stdout
    assert "benchmarks.idioms.jax -> backends.jax.models" in out.stdout
    assert "no import cycle anywhere BROKEN" in out.stdout
    assert "no subcommand imports a process or node module itself BROKEN" in out.stdout
    assert "harness.testing -> harness.processes.runner" in out.stdout
    assert "the readers import no plan, process, session or node BROKEN" in out.stdout
    assert "harness.report -> harness.session.resume" in out.stdout
    assert "No cycles are allowed in harness." in out.stdout
    assert "No cycles are allowed in backends.torch." in out.stdout
    assert any(
        f"- .{name} -> .cli" in out.stdout or f"- .cli -> .{name}" in out.stdout
        for name in ("check", "testing")
    )
