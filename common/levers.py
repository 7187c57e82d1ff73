"""Speed levers: the levers of one run (`Levers`), which ones it asks for, and why a backend refuses one.

A backend declares its levers in backends/<name>/backend.toml ([levers.NAME]: `values` for
precision, `refused` with the reason where it has no such switch). The harness reads them to
refuse before running; each backend's worker checks the same table, so the two never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from common import manifest
from common.errors import ConfigError, Unsupported
from common.flags import flag
from common.manifest import Lever

PRECISIONS = ("fp32", "tf32", "bf16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
GRAD_DTYPES = ("fp32", "bf16")
MAX_BUCKET_MB = 4096
MAX_PREFETCH = 16
# A lever's metadata: every backend has it, so none refuses it (not in PLAIN)
EVERY_BACKEND = "every_backend"


@dataclass(frozen=True)
class Levers:
    """A run's speed levers: the same flag on every backend that has it (backend.toml says which do), declared
    here once: each field is its flag (common/flags.py), its default the plain fp32 eager run's. Their names are
    RunConfig's flat keys in results.json. In a request a precision or a compile mode not given is None: the
    preset's, and no mode asked for."""

    precision: str = field(
        default="fp32",
        metadata=flag(
            "fp32 (TF32 off, set explicitly), tf32 (TF32 matmuls and convolutions; NVIDIA GPUs) or bf16 "
            "(bfloat16 compute, float32 weights and SGD); backends without it are reported as refused. "
            "Default: the preset's (bf16 for resnet50, else fp32)",
            choices=PRECISIONS,
            default=None,
        ),
    )
    compile: bool = field(
        default=False,
        metadata=flag(
            "torch.compile for torch (and Keras's ddp), hybridize for MXNet; JAX steps (and Keras's "
            "distribution) are always jit-compiled",
            action="store_true",
        ),
    )
    channels_last: bool = field(
        default=False,
        metadata=flag(
            "NHWC: torch's memory format for model and batches (Keras's models are NHWC, its own default, "
            "with or without it)",
            action="store_true",
        ),
    )
    resident_data: bool = field(
        default=False,
        metadata=flag(
            "copy each epoch's batches to the devices before its timer starts (no host-to-device "
            "copy inside the timed steps)",
            action="store_true",
        ),
    )
    compile_mode: str = field(
        default="default",
        metadata=flag(
            "with --compile, torch only: torch.compile's mode (not given: default; reduce-overhead: CUDA "
            "graphs, GPU only; max-autotune: autotuned kernels, long compiles)",
            choices=COMPILE_MODES,
            default=None,
        ),
    )
    prefetch: int = field(
        default=2,
        metadata={
            **flag(
                "put each batch on the devices N batches ahead of its step (pinned host memory and a copy "
                "stream on CUDA), so copies overlap compute; 0: each step copies its own batch",
                type=int,
                metavar="N",
            ),
            EVERY_BACKEND: True,
        },
    )
    grad_dtype: str = field(
        default="fp32",
        metadata=flag(
            "the dtype the gradients are exchanged in: fp32, or bf16 (compressed: DDP's bf16_compress_hook, "
            "FSDP's reduce dtype; the update stays float32); strategies without such a switch refuse it",
            choices=GRAD_DTYPES,
        ),
    )
    bucket_mb: int = field(
        default=0,
        metadata=flag(
            "the gradient buckets' size in MB that each allreduce carries (DDP's bucket_cap_mb); 0: the "
            "framework's default; strategies without buckets refuse it",
            type=int,
            metavar="MB",
        ),
    )

    @property
    def on(self) -> list[str]:
        """The levers that differ from the plain fp32 eager run, in words, e.g. ["bf16", "compile"]: a switch by
        its name, a value by itself, a compile mode with compile."""
        words = []
        for name, value in self.asked.items():
            if name == "compile_mode":
                continue  # (said with compile: a mode needs --compile)
            if name == "compile" and self.compile_mode != "default":
                words.append(f"compile={self.compile_mode}")
            elif name in ("grad_dtype", "bucket_mb"):  # a value that says nothing alone
                words.append(f"{name}={value}")
            else:
                words.append(name if value is True else str(value))
        return words

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
        for f in fields(self):  # (a worker's config file is untrusted input too)
            choices, value = f.metadata["flag"].choices, getattr(self, f.name)
            if choices and value not in choices:
                raise ConfigError(
                    f"unknown {flag_words(f.name, True)} {value!r}; choose from {', '.join(choices)}"
                )
        if self.compile_mode != "default" and not self.compile:
            raise ConfigError(f"--compile-mode {self.compile_mode} needs --compile")
        if not 0 <= self.bucket_mb <= MAX_BUCKET_MB:
            raise ConfigError(
                f"--bucket-mb must be between 0 and {MAX_BUCKET_MB} (got {self.bucket_mb})"
            )
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
# refusal names them (Levers' own: results.json's)
PLAIN = {f.name: f.default for f in fields(Levers) if not f.metadata.get(EVERY_BACKEND)}


def flag_words(lever: str, value) -> str:
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
        f"{flag_words(lever, value)}: {why}"
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
    meaning, while --resident-data only moves the batches earlier and --bucket-mb only groups the gradients
    another way (each value summed alike), so they run in float64 too."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    same_math = ("resident_data", "bucket_mb")
    changed = [word for word in cfg.levers.on if not word.startswith(same_math)]
    if dtype == "float64" and changed:
        raise Unsupported(f"dtype float64 runs the plain step only, not {', '.join(changed)}")


TF32_ON_CPU = "TF32 is a mode of NVIDIA tensor cores; there is none on the CPU"


def check(cfg) -> str | None:
    """The worker side: why this run's levers cannot run on its backend or its devices (one line), or None."""
    if cfg.levers.precision == "tf32" and cfg.device_kind != "gpu":
        return TF32_ON_CPU
    declared = manifest.load(cfg.backend).levers
    reasons = refusals(declared, cfg.levers.asked)
    reasons += strategy_refusals(declared, cfg.levers.asked, cfg.strategy)
    return "; ".join(reasons) or None


def strategy_refusals(declared: dict[str, Lever], levers: dict, strategy: str) -> list[str]:
    """`--flag value: reason` for every asked lever the backend offers but not to `strategy` (backend.toml's
    [levers.NAME] strategies_refused)."""
    return [
        f"{flag_words(lever, value)} with {strategy}: {why}"
        for lever, value in levers.items()
        if lever in declared and (why := dict(declared[lever].strategies_refused).get(strategy))
    ]
