"""The project's shape, read from its source (no framework is imported): backends side by side."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from common import manifest
from common.trainer import METHODS

ROOT = Path(__file__).resolve().parents[2]
# What every backend package holds, under the same names (a backend may add files of its own).
BACKEND_FILES = {
    "__init__.py",
    "__main__.py",
    "backend.toml",
    "distributed.py",
    "environment.py",
    "models.py",
    "parallel.py",
    "requirements.txt",
    "strategies.py",
}


def trainer_classes(path: Path) -> dict[str, list[str]]:
    """{class: its methods in the order defined} for every class in `path` that is a common.trainer.Trainer
    (directly, or through another such class of the same file)."""
    tree = ast.parse(path.read_text())
    trainers: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            bases = {
                b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
            }
            if "Trainer" in bases or bases & set(trainers):
                trainers[node.name] = [f.name for f in node.body if isinstance(f, ast.FunctionDef)]
    return trainers


def in_glossary_order(methods: list[str]) -> bool:
    return [METHODS.index(m) for m in methods] == sorted(METHODS.index(m) for m in methods)


@pytest.mark.parametrize("backend", manifest.known())
def test_every_backend_holds_the_same_files(backend):
    files = {p.name for p in (ROOT / "backends" / backend).iterdir() if p.is_file()}
    assert BACKEND_FILES <= files, f"backends/{backend} lacks {sorted(BACKEND_FILES - files)}"


@pytest.mark.parametrize("backend", manifest.known())
def test_strategy_classes_use_the_glossary_in_its_order(backend):
    trainers = trainer_classes(ROOT / "backends" / backend / "strategies.py")
    assert trainers, f"backends/{backend}/strategies.py has no common.trainer.Trainer subclass"
    for name, methods in trainers.items():
        public = [m for m in methods if not m.startswith("_") or m == "__init__"]
        unknown = [m for m in public if m not in METHODS]
        assert not unknown, (
            f"{backend} {name}: public methods outside the glossary (make them private): {unknown}"
        )
        assert in_glossary_order(public), (
            f"{backend} {name}: {public} are not in common.trainer.METHODS' order"
        )


def test_the_order_check_can_fail(tmp_path):
    source = tmp_path / "strategies.py"
    source.write_text(
        "class A(Trainer):\n    def step(self): ...\n    def reset(self): ...\n"
        "class B(A):\n    def helper(self): ...\n"
    )
    trainers = trainer_classes(source)
    assert trainers == {"A": ["step", "reset"], "B": ["helper"]}
    assert not in_glossary_order(trainers["A"]) and in_glossary_order(["reset", "step"])
