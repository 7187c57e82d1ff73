"""`python -m harness test`: the harness's tests here, each backend's tests inside its own environment.

Each suite is a pytest run with a JUnit XML report; the counts are added up and the
last line printed is `N passed, N failed` (and skipped). Exit status 0 only if nothing
failed and every suite ran at least one test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from harness import envs, registry
from harness.envs import ROOT


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped


def junit_counts(path: Path) -> Counts:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    c = Counts()
    for s in suites:
        tests, failures, errors, skipped = (int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
        c.failed += failures + errors
        c.skipped += skipped
        c.passed += tests - failures - errors - skipped
    return c


def run_suite(title: str, python: str, paths: list[str], extra_env: dict, pytest_args: list[str]) -> Counts:
    print(f"\n=== {title} ===", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        env = {**os.environ, "PYTHONPATH": str(ROOT), **extra_env}
        cmd = [python, "-m", "pytest", *paths, "-q", f"--junitxml={xml}", *pytest_args]
        rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
        if not xml.exists():
            print(f"{title}: pytest exited with status {rc} and no report", flush=True)
            return Counts(failed=1)
        counts = junit_counts(xml)
    if counts.total == 0 and not pytest_args:  # (with -k and the like, selecting nothing is fine)
        print(f"{title}: no test ran; counted as a failure", flush=True)
        counts.failed += 1
    return counts


def main(argv: list[str]) -> int:
    from harness.cli import Parser, parse_backends, parse_pythons  # one parser for names and --python
    p = Parser(prog="python -m harness test",
                                description="Run the harness tests, then each backend's tests in its own environment.")
    p.add_argument("--backend", default="all", help="backends whose tests to run (comma list, or all, or none)")
    p.add_argument("--python", action="append", default=[], metavar="BACKEND=PATH",
                   help="use this interpreter for BACKEND's tests instead of .venvs/BACKEND/")
    p.add_argument("pytest_args", nargs="*", help="passed to pytest (after --), e.g. -- -k split -x")
    args = p.parse_args(argv)
    names = [] if args.backend == "none" else parse_backends(args.backend)
    pythons = parse_pythons(args.python)

    results: dict[str, Counts] = {}
    results["harness"] = run_suite("harness (no framework)", sys.executable, ["tests/harness"], {}, args.pytest_args)
    for name in names:
        backend = registry.load(name)
        if not backend.implemented:
            print(f"\n=== {name}: not implemented in this version, no tests ===")
            continue
        try:
            python = pythons.get(name) or str(envs.ensure(name, backend.requirements))
        except envs.EnvError as e:
            print(f"\n=== {name}: environment setup failed ===\n{e}")
            results[name] = Counts(failed=1)
            continue
        own = [f"tests/backends/test_{name}.py"] if (ROOT / "tests" / "backends" / f"test_{name}.py").exists() else []
        results[name] = run_suite(f"{name} (inside its environment)", python, ["tests/backends/test_contract.py", *own],
                                  {"DPBENCH_BACKEND": name}, args.pytest_args)

    tested = [name for name in names if name in results and results[name].failed == 0]
    if len(tested) >= 2 and not args.pytest_args:
        results["cross"] = run_suite(f"cross-backend ({', '.join(tested)})", sys.executable, ["tests/cross"],
                                     {"DPBENCH_BACKENDS": ",".join(tested),
                                      "DPBENCH_PYTHONS": ",".join(f"{k}={v}" for k, v in pythons.items())}, [])

    total = Counts()
    print("\n=== summary ===")
    for title, c in results.items():
        print(f"{title:10} {c.passed} passed, {c.failed} failed, {c.skipped} skipped")
        total.passed += c.passed
        total.failed += c.failed
        total.skipped += c.skipped
    print(f"{total.passed} passed, {total.failed} failed, {total.skipped} skipped", flush=True)
    return 1 if total.failed or total.passed == 0 else 0
