"""The backends the suite knows, read from backends/<name>/backend.toml (never by importing them)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from harness.envs import ROOT

BACKENDS_DIR = ROOT / "backends"
KNOWN = ("torch", "jax", "mxnet")       # the suite's backends, implemented or not yet
ALIASES = {"pytorch": "torch"}


@dataclass
class Strategy:
    name: str
    summary: str
    requires: str | None = None          # "cuda": refused where no GPU is present
    bn: list[str] = field(default_factory=lambda: ["local"])   # the BatchNorm modes it runs (--bn)


@dataclass
class Option:
    """A backend-specific switch (`--option NAME=VALUE`), e.g. MXNet's kvstore type."""
    name: str
    values: list[str]
    default: str
    summary: str = ""
    strategies: list[str] | None = None   # None: applies to every strategy


@dataclass
class Lever:
    """A speed lever (--precision, --compile, --channels-last, --resident-data) as a backend offers it."""
    name: str
    summary: str = ""
    values: list[str] | None = None       # precision: the values it runs
    refused: str = ""                     # why the backend does not offer it (or the other values)


@dataclass
class Backend:
    name: str
    display: str
    implemented: bool
    strategies: dict[str, Strategy] = field(default_factory=dict)
    reason: str = ""                      # why it is unavailable, when it is
    options: dict[str, Option] = field(default_factory=dict)
    levers: dict[str, Lever] = field(default_factory=dict)

    declared_levers: dict = field(default_factory=dict)   # backend.toml's [levers] table, as read

    def options_for(self, strategy: str) -> dict[str, Option]:
        return {k: o for k, o in self.options.items() if o.strategies is None or strategy in o.strategies}

    @property
    def requirements(self) -> Path:
        return BACKENDS_DIR / self.name / "requirements.txt"


def load(name: str) -> Backend:
    meta = BACKENDS_DIR / name / "backend.toml"
    if not meta.is_file():
        return Backend(name, name, implemented=False,
                       reason=f"the {name} backend is not implemented in this version of the suite")
    with open(meta, "rb") as f:
        d = tomllib.load(f)
    strategies = {k: Strategy(k, v.get("summary", ""), v.get("requires"), v.get("bn", ["local"]))
                  for k, v in d.get("strategies", {}).items()}
    options = {k: Option(k, [str(x) for x in v["values"]], str(v["default"]), v.get("summary", ""), v.get("strategies"))
               for k, v in d.get("options", {}).items()}
    levers = {k: Lever(k, v.get("summary", ""), v.get("values"), v.get("refused", ""))
              for k, v in d.get("levers", {}).items()}
    return Backend(d["name"], d.get("display", d["name"]), True, strategies, options=options, levers=levers,
                   declared_levers=d.get("levers", {}))


def all_backends() -> dict[str, Backend]:
    return {name: load(name) for name in KNOWN}


def canonical_name(name: str) -> str | None:
    name = name.strip().lower()
    name = ALIASES.get(name, name)
    return name if name in KNOWN else None
