"""backends/<name>/backend.toml, read in one place into typed records (no framework is imported).

The harness plans with it, the workers refuse with it (common/levers.py), the backends read their
options' defaults from it, and the tests take their strategies from it, so none of them can disagree.
A backend is known to the suite by having a backend.toml; its `aliases` are other names it answers to.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

BACKENDS_DIR = Path(__file__).resolve().parent.parent / "backends"


@dataclass(frozen=True)
class Strategy:
    name: str
    summary: str
    requires: str | None = None  # "cuda": refused where no GPU is present
    bn: tuple[str, ...] = ("local",)  # the BatchNorm modes it runs (--bn)
    engine: str | None = None  # what runs it on several nodes (--nodes); None: one process only
    bn_refused: str = ""  # why it has no other BatchNorm mode, where there is more to say
    # what `harness parity` measures it against: its framework's idiom (benchmarks/idioms/<backend>.py), its name in
    # the report (the backend's, unless declared) and the environment it runs in (Keras's: the framework under it)
    idiom: str = ""
    idiom_env: tuple[tuple[str, str], ...] = ()
    # the backend whose engine it runs its nodes with, where that is another's (Keras's ddp: torch's launcher): that
    # backend's suite proves the engine across nodes
    engine_backend: str | None = None
    # a variant users choose by name (sharded parameters): a run or parity plans it only when --strategy names it,
    # so the default sweep stays the replicated strategies; check proves it with the rest
    variant: bool = False
    # its step's communication in allreduces of the gradients (the projection's volume): an all-gather and a
    # reduce-scatter are one allreduce's bytes, ZeRO-3's second all-gather half of one more
    volume: float = 1.0


@dataclass(frozen=True)
class Option:
    """A backend-specific switch (`--option NAME=VALUE`), e.g. MXNet's kvstore type."""

    name: str
    values: tuple[str, ...]
    default: str
    summary: str = ""
    strategies: tuple[str, ...] | None = None  # None: applies to every strategy
    # the default when the sweep has several nodes (a distributed kvstore)
    nodes_default: str | None = None
    # (value, volume): the strategy's communication volume where a value changes it (FSDP's resharding)
    volumes: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Lever:
    """A speed lever (--precision, --compile, --channels-last, --resident-data) as a backend offers it."""

    name: str
    summary: str = ""
    values: tuple[str, ...] | None = None  # precision, compile_mode: the values it runs
    refused: str = ""  # why the backend does not offer it (or the other values)
    # the strategies whose step it leaves as it is, to the last bit (XLA compiles every step anyway)
    changes_nothing: tuple[str, ...] = ()
    # (strategy, why) of the strategies that cannot take it on this backend (the worker refuses the run with it)
    strategies_refused: tuple[tuple[str, str], ...] = ()


# The levers --best decides (backend.toml's [best]): how a step is compiled and laid out. Precision changes the
# math and --resident-data where the batches wait, so those stay the user's to ask for, on both rows.
BEST_LEVERS = ("compile", "compile_mode", "channels_last")
DEVICE_KINDS = ("gpu", "cpu")


@dataclass(frozen=True)
class Best:
    """--best: the framework's documented fastest mode, the levers it sets on each device kind, and why."""

    why: str = ""
    gpu: dict = field(default_factory=dict)  # {lever: value}, e.g. {"compile": True}
    cpu: dict = field(default_factory=dict)

    def on(self, kind: str) -> dict:
        """The levers the best mode sets on `kind` devices ({}: the default is the best)."""
        return dict(getattr(self, kind))


@dataclass(frozen=True)
class KernelsProbe:
    """[kernels_probe]: how the portable test pass shows what the framework's CPU kernels run with
    (harness/suites/kernels.py): a script beside the backend, run in its environment with the library's verbose switches
    (`env`)."""

    script: Path
    env: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Cache:
    """A compile cache the framework keeps between processes (common/caches.py): the variable that names its folder,
    the subfolder it gets, how the report names it, and whether the framework keeps it unasked (then a cold run
    still gets a fresh folder of its own)."""

    variable: str
    folder: str
    display: str
    unasked: bool = False


@dataclass(frozen=True)
class Framework:
    """[framework]: what the shared code knows of a framework, declared in its backend.toml only."""

    # the top-level modules it is imported by: shared code imports none of them (pyproject.toml's import contracts
    # list them, and a test holds the lists to these)
    imports: tuple[str, ...] = ()
    # the backend every other is checked against (`harness check`), and its strategy in a report's small check
    reference: bool = False
    reference_strategy: str = ""
    # its device's out-of-memory error, as regexes; the device's memory such a message gives, (regex, how to say it)
    out_of_memory: tuple[str, ...] = ()
    memory_words: tuple[tuple[str, str], ...] = ()
    # the portable test pass's caps: variables set, and flags appended to a variable (XLA_FLAGS)
    portable_env: tuple[tuple[str, str], ...] = ()
    portable_flags: tuple[tuple[str, str], ...] = ()
    # its compile caches, the variables set with a shared folder, and the caps the code it compiles depends on:
    # variables, and flags inside a variable
    caches: tuple[Cache, ...] = ()
    shared_cache_env: tuple[tuple[str, str], ...] = ()
    compiled_for: tuple[str, ...] = ()
    compiled_for_flags: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Manifest:
    name: str
    display: str
    aliases: tuple[str, ...] = ()
    strategies: dict[str, Strategy] = field(default_factory=dict)
    # [strategies_refused]: strategies other backends run that this one cannot, each with the reason
    strategies_refused: dict[str, str] = field(default_factory=dict)
    options: dict[str, Option] = field(default_factory=dict)
    levers: dict[str, Lever] = field(default_factory=dict)
    best: Best = field(default_factory=Best)
    # the libraries whose CPU kernels it runs, by the backend that probes them (the portable pass runs each one's
    # kernels_probe): its own, or Keras's torch and jax
    kernels: tuple[str, ...] = ()
    kernels_probe: KernelsProbe | None = None  # None: its kernels are other backends' (Keras's)
    # its test suite's wall time on one core of a 2-core CPU ([tests] minutes), and its portable suite's ([tests]
    # portable_minutes): `harness test` starts the longest first
    test_minutes: float = 0.0
    portable_test_minutes: float = 0.0
    # [profile] ops: the op names of its framework's --profile traces, (category, regex) in order, the first match
    # deciding (common/profiling.py); none where its traces are another framework's (Keras's)
    ops: tuple[tuple[str, str], ...] = ()
    framework: Framework = field(default_factory=Framework)

    def options_for(self, strategy: str) -> dict[str, Option]:
        return {
            k: o
            for k, o in self.options.items()
            if o.strategies is None or strategy in o.strategies
        }

    def volume(self, strategy: str, options: dict[str, str]) -> float:
        """The step's communication in allreduces of the gradients, for `strategy` with the run's `options`: an
        option's value that declares one, else the strategy's (1 where neither says)."""
        for name, option in self.options_for(strategy).items():
            if volume := dict(option.volumes).get(self.option(options, name)):
                return volume
        return self.strategies[strategy].volume if strategy in self.strategies else 1.0

    def option(self, options: dict[str, str], name: str) -> str:
        """The value of option `name` in a run's `options`: the one asked for, else the declared default."""
        return options.get(name) or self.options[name].default

    @property
    def requirements(self) -> Path:
        return BACKENDS_DIR / self.name / "requirements.txt"


def _strings(values) -> tuple[str, ...] | None:
    return None if values is None else tuple(str(v) for v in values)


@functools.cache
def load(name: str) -> Manifest:
    with open(BACKENDS_DIR / name / "backend.toml", "rb") as f:
        d = tomllib.load(f)
    return Manifest(
        name=d["name"],
        display=d.get("display", d["name"]),
        aliases=_strings(d.get("aliases", [])),
        strategies={
            k: Strategy(
                k,
                v.get("summary", ""),
                v.get("requires"),
                _strings(v.get("bn", ["local"])),
                v.get("engine"),
                v.get("bn_refused", ""),
                v.get("idiom", d["name"]),
                tuple((str(key), str(value)) for key, value in v.get("idiom_env", {}).items()),
                engine_backend=read_engine_backend(d["name"], k, v),
                variant=bool(v.get("variant", False)),
                volume=float(v.get("volume", 1.0)),
            )
            for k, v in d.get("strategies", {}).items()
        },
        strategies_refused={str(k): str(v) for k, v in d.get("strategies_refused", {}).items()},
        options={
            k: Option(
                k,
                _strings(v["values"]),
                str(v["default"]),
                v.get("summary", ""),
                _strings(v.get("strategies")),
                v.get("nodes_default"),
                tuple((str(value), float(volume)) for value, volume in v.get("volume", {}).items()),
            )
            for k, v in d.get("options", {}).items()
        },
        levers={
            k: Lever(
                k,
                v.get("summary", ""),
                _strings(v.get("values")),
                v.get("refused", ""),
                read_changes_nothing(d["name"], k, v, d.get("strategies", {})),
                pairs(v.get("strategies_refused", {})),
            )
            for k, v in d.get("levers", {}).items()
        },
        best=read_best(d["name"], d.get("best", {})),
        kernels=_strings(d.get("kernels", [d["name"]])),
        kernels_probe=read_kernels_probe(d["name"], d.get("kernels_probe")),
        test_minutes=float(d.get("tests", {}).get("minutes", 0.0)),
        portable_test_minutes=float(d.get("tests", {}).get("portable_minutes", 0.0)),
        ops=read_ops(d.get("profile", {}).get("ops", [])),
        framework=read_framework(d.get("framework", {})),
    )


def pairs(table: dict) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in table.items())


def read_framework(table: dict) -> Framework:
    """backend.toml's [framework]: each cache a table of its own ([framework.caches.VARIABLE])."""
    return Framework(
        imports=_strings(table.get("imports", [])),
        reference=bool(table.get("reference", False)),
        reference_strategy=str(table.get("reference_strategy", "")),
        out_of_memory=_strings(table.get("out_of_memory", [])),
        memory_words=tuple(
            (str(regex), str(said)) for regex, said in table.get("memory_words", [])
        ),
        portable_env=pairs(table.get("portable_env", {})),
        portable_flags=pairs(table.get("portable_flags", {})),
        caches=tuple(
            Cache(variable, str(c["folder"]), str(c["display"]), bool(c.get("unasked", False)))
            for variable, c in table.get("caches", {}).items()
        ),
        shared_cache_env=pairs(table.get("shared_cache_env", {})),
        compiled_for=_strings(table.get("compiled_for", [])),
        compiled_for_flags=pairs(table.get("compiled_for_flags", {})),
    )


def read_best(name: str, table: dict) -> Best:
    """backend.toml's [best], its levers checked: a typo there would quietly plan a best row that is the default."""
    for kind in DEVICE_KINDS:
        unknown = set(table.get(kind, {})) - set(BEST_LEVERS)
        if unknown:
            raise ValueError(
                f"backends/{name}/backend.toml: [best.{kind}] sets {', '.join(sorted(unknown))}; "
                f"--best decides {', '.join(BEST_LEVERS)} only"
            )
    return Best(table.get("why", ""), **{kind: dict(table.get(kind, {})) for kind in DEVICE_KINDS})


def read_changes_nothing(name: str, lever: str, table: dict, strategies: dict) -> tuple[str, ...]:
    """[levers.NAME] changes_nothing: the strategies it declares, checked, since the contract tests hold those
    strategies' steps with the lever to the plain step bit for bit and a typo would quietly hold none."""
    declared = table.get("changes_nothing", [])
    if not isinstance(declared, list) or not set(map(str, declared)) <= set(strategies):
        raise ValueError(
            f"backends/{name}/backend.toml: [levers.{lever}] changes_nothing = {declared!r}; it must be a list of "
            f"strategies of {name} ({', '.join(strategies)})"
        )
    return _strings(declared)


def read_engine_backend(name: str, strategy: str, table: dict) -> str | None:
    """[strategies.NAME] engine_backend, checked: another backend with a backend.toml, on a strategy with an
    engine, or its suite would skip proving nodes nobody else proves."""
    other = table.get("engine_backend")
    if other is None:
        return None
    if (
        not isinstance(other, str)
        or other == name
        or not (BACKENDS_DIR / other / "backend.toml").is_file()
        or not table.get("engine")
    ):
        raise ValueError(
            f"backends/{name}/backend.toml: [strategies.{strategy}] engine_backend = {other!r}; it must name "
            f"another backend (one with a backend.toml), on a strategy with an `engine`"
        )
    return other


def read_kernels_probe(name: str, table: dict | None) -> KernelsProbe | None:
    """backend.toml's [kernels_probe], its script's path resolved beside the backend."""
    if table is None:
        return None
    env = {str(k): str(v) for k, v in table.get("env", {}).items()}
    return KernelsProbe(BACKENDS_DIR / name / table["script"], env)


def read_ops(entries: list) -> tuple[tuple[str, str], ...]:
    """backend.toml's [profile] ops as (category, regex) pairs: a regex written as a list (to wrap a long one) is its
    alternatives joined with "|"."""
    return tuple(
        (str(category), "|".join(regex) if isinstance(regex, list) else str(regex))
        for category, regex in entries
    )


def strategy_refusal(
    backend: Manifest, strategy: str, device_kind: str, bn: str, nodes: int
) -> str | None:
    """Why `strategy` of `backend` cannot run on `device_kind` devices with `bn` BatchNorm on `nodes` nodes, from
    what backend.toml declares (None: nothing declared stops it). The harness plans with it and every backend's
    worker refuses with it (common/backend.py)."""
    if strategy not in backend.strategies:
        return missing_strategy(backend, strategy)
    if reason := engine_refusal(backend, strategy, nodes):
        return reason
    declared = backend.strategies[strategy]
    if declared.requires == "cuda" and device_kind != "gpu":
        return f"{backend.name} {strategy} needs CUDA GPUs; none is present ({declared.summary})"
    if bn not in declared.bn:
        others = [s.name for s in backend.strategies.values() if bn in s.bn]
        because = f": {declared.bn_refused}" if declared.bn_refused else ""
        return (
            f"{backend.name} {strategy} has no {bn} BatchNorm{because} (it runs: {', '.join(declared.bn)}; "
            f"--bn {bn} runs with: {', '.join(others) or 'no strategy of ' + backend.name})"
        )
    return None


def missing_strategy(backend: Manifest, strategy: str) -> str:
    """Why `backend` has no `strategy`: the reason its backend.toml gives ([strategies_refused]), else its own."""
    offered = f"it has {', '.join(backend.strategies)}"
    if reason := backend.strategies_refused.get(strategy):
        return f"{backend.name} cannot run {strategy}: {reason} ({offered})"
    return f"{backend.name} has no strategy {strategy!r}; {offered}"


def engine_refusal(backend: Manifest, strategy: str, nodes: int) -> str | None:
    """Why `strategy` cannot run on `nodes` nodes (None: it can)."""
    if nodes == 1 or backend.strategies[strategy].engine:
        return None
    engines = [s.name for s in backend.strategies.values() if s.engine]
    return (
        f"{backend.name} {strategy} runs in one process; --nodes {nodes} needs a strategy with a distributed "
        f"engine ({backend.name}: {', '.join(engines) or 'none'})"
    )


@functools.cache
def known() -> tuple[str, ...]:
    """Every backend with a backend.toml, in the suite's order (the reference first)."""
    names = sorted(p.parent.name for p in BACKENDS_DIR.glob("*/backend.toml"))
    return tuple(sorted(names, key=lambda n: (not load(n).framework.reference, n)))


def reference() -> str:
    """The backend every other is checked against: the one whose [framework] says `reference = true`."""
    named = [name for name in known() if load(name).framework.reference]
    if len(named) != 1:
        raise ValueError(
            f"exactly one backend.toml must say [framework] reference = true, not {len(named)}: {named}"
        )
    return named[0]


def frameworks() -> list[Framework]:
    """Every backend's [framework], in the suite's order."""
    return [load(name).framework for name in known()]


def choices() -> str:
    """The backends' names for a message: "torch (pytorch), jax, keras (keras3), mxnet, all"."""
    names = [f"{n} ({', '.join(load(n).aliases)})" if load(n).aliases else n for n in known()]
    return ", ".join([*names, "all"])


def canonical_name(name: str) -> str | None:
    """A backend's name from any of its names (case-insensitive), or None for no backend."""
    name = name.strip().lower()
    for backend in known():
        if name == backend or name in load(backend).aliases:
            return backend
    return None
