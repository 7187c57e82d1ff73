"""Backend tests run inside one backend's environment: `python -m harness test` sets DPBENCH_BACKEND."""

from __future__ import annotations

import importlib
import os
import tomllib
from pathlib import Path

import pytest

NAME = os.environ.get("DPBENCH_BACKEND")


def pytest_collection_modifyitems(config, items):
    if NAME:
        return
    skip = pytest.mark.skip(reason="backend tests run inside a backend environment: python -m harness test")
    for item in items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def backend():
    return importlib.import_module(f"backends.{NAME}")


def load_meta() -> dict:
    with open(Path(__file__).resolve().parents[2] / "backends" / NAME / "backend.toml", "rb") as f:
        return tomllib.load(f)


@pytest.fixture(scope="session")
def meta():
    return load_meta()


def pytest_generate_tests(metafunc):
    """`strategy` takes each strategy the backend declares in its backend.toml."""
    if "strategy" in metafunc.fixturenames:
        metafunc.parametrize("strategy", list(load_meta()["strategies"]) if NAME else ["none"])
