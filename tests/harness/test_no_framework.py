"""The harness never imports a framework: not in its source, not at run time; and what shared code knows of a
framework is read from its backend.toml's [framework], never written in the shared code itself."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

from common import manifest
from tests.harness.helpers import ROOT

# Every module a backend's framework is imported by, as its backend.toml declares them.
FRAMEWORKS = {module for framework in manifest.frameworks() for module in framework.imports}
SHARED = ("harness", "common")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_harness_and_common_sources_import_no_framework():
    for folder in SHARED:
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


def test_the_import_contracts_forbid_every_framework_a_backend_declares():
    """pyproject.toml's contracts that keep the frameworks out of shared code list the modules each backend.toml's
    [framework] imports declares, no more and no fewer (they once disagreed: the test left out keras)."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    lists = [
        set(c.get("forbidden_modules", []))
        for c in contracts["contracts"]
        if set(c.get("forbidden_modules", [])) & FRAMEWORKS
    ]
    assert len(lists) == 2
    assert all(forbidden == FRAMEWORKS for forbidden in lists), lists


def declared_names() -> set[str]:
    """The names of the frameworks: each backend's name and aliases and the modules its framework is imported by
    (prose may name them: a string that is one of them is code)."""
    return {
        word
        for name in manifest.known()
        for word in (name, *manifest.load(name).aliases, *manifest.load(name).framework.imports)
    }


def declared_words() -> set[str]:
    """What a backend.toml's [framework] declares that only its framework knows: its caps' and caches' variables
    and flags, its out-of-memory words (no string in shared code holds one)."""
    words = set()
    for f in manifest.frameworks():
        words |= {*f.compiled_for, *f.out_of_memory, *(c.variable for c in f.caches)}
        words |= {k for k, _ in (*f.portable_env, *f.shared_cache_env)}
        words |= {cap for _, cap in f.compiled_for_flags}
    return words


def code_strings(path: Path) -> list[tuple[int, str]]:
    """The string literals of a module's code (its docstrings and comments are prose, which may name a framework)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def test_shared_code_names_no_framework_outside_its_backend_toml():
    """No string in the code of harness/ or common/ is a backend's name or alias, one of its modules, or holds a
    variable, flag or word its backend.toml's [framework] declares: a fifth backend edits no shared file for what
    its framework is (docs/ARCHITECTURE.md, "Adding a backend")."""
    names, words = declared_names(), declared_words()
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text!r}"
        for folder in SHARED
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line, text in code_strings(path)
        if text in names or any(w in text for w in words)
    ]
    assert found == []
