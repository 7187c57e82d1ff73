"""Speed levers: the levers of one run (`Levers`), which ones it asks for, and why a backend refuses one.

A backend declares its levers in backends/<name>/backend.toml ([levers.NAME]: `values` for
precision, `refused` with the reason where it has no such switch). The harness reads them to
refuse before running; each backend's worker checks the same table, so the two never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from common import manifest
from common.errors import ConfigError, Unsupported
from common.manifest import Lever

PRECISIONS = ("fp32", "tf32", "bf16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
MAX_PREFETCH = 16


@dataclass(frozen=True)
class Levers:
    """A run's speed levers: the same flag on every backend that has it (backend.toml says which do). Their
    names are RunConfig's flat keys in results.json."""

    precision: str = "fp32"  # fp32 (TF32 off), tf32 (TF32 matmuls/convs), bf16 (bfloat16 compute)
    compile: bool = False  # torch.compile / (jit is inherent to JAX) / Gluon hybridize
    channels_last: bool = False  # torch: NHWC memory format for the model and batches
    # each epoch's batches copied to the devices before its timer starts
    resident_data: bool = False
    # torch.compile's mode: default, reduce-overhead (CUDA graphs), max-autotune
    compile_mode: str = "default"
    prefetch: int = 2  # batches put on the devices ahead of their step (0: copied inside it)

    @property
    def on(self) -> list[str]:
        """The levers that differ from the plain fp32 eager run, in words, e.g. ["bf16", "compile"]."""
        mode = "compile" if self.compile_mode == "default" else f"compile={self.compile_mode}"
        compiled = [mode] if self.compile else []
        return (
            ([self.precision] if self.precision != "fp32" else [])
            + compiled
            + [name for name in ("channels_last", "resident_data") if getattr(self, name)]
        )

    @property
    def asked(self) -> dict:
        """The levers that differ from the plain fp32 eager run, {name: value} (prefetch is no lever a backend
        refuses: every one has it)."""
        return {
            name: getattr(self, name)
            for name, plain in PLAIN.items()
            if getattr(self, name) != plain
        }

    def validate(self) -> Levers:
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"unknown --precision {self.precision!r}; choose from {', '.join(PRECISIONS)}"
            )
        if self.compile_mode not in COMPILE_MODES:
            raise ConfigError(
                f"unknown --compile-mode {self.compile_mode!r}; choose from {', '.join(COMPILE_MODES)}"
            )
        if self.compile_mode != "default" and not self.compile:
            raise ConfigError(f"--compile-mode {self.compile_mode} needs --compile")
        if not 0 <= self.prefetch <= MAX_PREFETCH:
            raise ConfigError(
                f"--prefetch must be between 0 and {MAX_PREFETCH} (got {self.prefetch})"
            )
        return self

    def flat(self) -> dict:
        """Its fields by their names in results.json's config (the same names)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_flat(cls, d: dict) -> Levers:
        """From a flat config (results.json's, a worker's config file): the lever keys it has."""
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


# The levers a backend may refuse, at the values of the plain fp32 eager run (Levers' defaults), in the order a
# refusal names them
PLAIN = {
    "precision": "fp32",
    "compile": False,
    "compile_mode": "default",
    "channels_last": False,
    "resident_data": False,
}


def flag(lever: str, value) -> str:
    name = "--" + lever.replace("_", "-")
    return name if value is True else f"{name} {value}"


def refusal(declared: dict[str, Lever], lever: str, value) -> str | None:
    """Why a backend with the `declared` levers (its manifest's) cannot run `lever` at `value` (None: it can)."""
    if lever not in declared:
        return f"no {lever} lever declared"
    entry = declared[lever]
    if entry.values is not None:
        return (
            None
            if value in entry.values
            else (entry.refused or f"runs {', '.join(entry.values)} only")
        )
    return entry.refused or None


def refusals(declared: dict[str, Lever], levers: dict) -> list[str]:
    """`--flag value: reason` for every asked lever the backend refuses."""
    return [
        f"{flag(lever, value)}: {why}"
        for lever, value in levers.items()
        if (why := refusal(declared, lever, value))
    ]


DTYPES = (
    "float32",
    "float64",
)  # of the backends' equivalence API (gradients, train_trace, train_steps)


def check_dtype(dtype: str, cfg) -> None:
    """The equivalence API's dtype, the same rule in every backend: float64 proves the math of the plain
    step; a lever that changes how float32 is computed (precision, compile, channels-last) has no float64
    meaning, while --resident-data only moves the batches earlier, so it runs in float64 too."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    changed = [lever for lever in cfg.levers.on if lever != "resident_data"]
    if dtype == "float64" and changed:
        raise Unsupported(f"dtype float64 runs the plain step only, not {', '.join(changed)}")


TF32_ON_CPU = "TF32 is a mode of NVIDIA tensor cores; there is none on the CPU"


def check(cfg) -> str | None:
    """The worker side: why this run's levers cannot run on its backend or its devices (one line), or None."""
    if cfg.levers.precision == "tf32" and cfg.device_kind != "gpu":
        return TF32_ON_CPU
    reasons = refusals(manifest.load(cfg.backend).levers, cfg.levers.asked)
    return "; ".join(reasons) or None
