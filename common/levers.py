"""Speed levers: which ones a run asks for, and why a backend refuses one.

A backend declares its levers in backends/<name>/backend.toml ([levers.NAME]: `values` for
precision, `refused` with the reason where it has no such switch). The harness reads them to
refuse before running; each backend's worker checks the same table, so the two never disagree.
"""

from __future__ import annotations

from common import manifest
from common.errors import Unsupported
from common.manifest import Lever

PLAIN = {
    "precision": "fp32",
    "compile": False,
    "compile_mode": "default",
    "channels_last": False,
    "resident_data": False,
}


def asked(**values) -> dict:
    """The levers among `values` (RunConfig field names) that differ from the plain fp32 eager run."""
    return {name: value for name, value in values.items() if name in PLAIN and value != PLAIN[name]}


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
    changed = [lever for lever in cfg.levers if lever != "resident_data"]
    if dtype == "float64" and changed:
        raise Unsupported(f"dtype float64 runs the plain step only, not {', '.join(changed)}")


TF32_ON_CPU = "TF32 is a mode of NVIDIA tensor cores; there is none on the CPU"


def check(cfg) -> str | None:
    """The worker side: why this run's levers cannot run on its backend or its devices (one line), or None."""
    if cfg.precision == "tf32" and cfg.device_kind != "gpu":
        return TF32_ON_CPU
    reasons = refusals(
        manifest.load(cfg.backend).levers, asked(**{name: getattr(cfg, name) for name in PLAIN})
    )
    return "; ".join(reasons) or None
