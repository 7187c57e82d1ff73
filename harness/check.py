"""`python -m harness check`: show, with numbers, that the backends compute the same thing.

On one set of canonical weights (one file, one hash) and the same batches, every selected
backend, strategy and device count measures (common/measurements.py, inside its environment):
forward logits, the first batch's loss and gradients after the allreduce, the weights
after one SGD step, and the loss of every step of a short trace. The harness compares
them with torch's (harness/checking/equivalence.py) and prints one table; the exit status is 1 if any row fails.
"""

from __future__ import annotations

from harness.arguments import Parser, defaults_of, flags_of, request_of
from harness.checking.equivalence import table
from harness.checking.planned import CheckPlan, EquivalenceRequest, plan_check
from harness.checking.workers import dataset_words, run_checks
from harness.planning.request import (
    DataRequest,
    DevicesRequest,
    EachRun,
    NodeRequest,
    RecipeRequest,
    WhatRuns,
)

# ------------------------------------------------------------------------- command

DESCRIPTION = (
    "Compare forward passes, gradients, SGD steps and k-vs-1-device training across backends and "
    "strategies on one set of canonical weights; exit 1 on any failure."
)


def parents() -> list[Parser]:
    """The flag groups of `python -m harness check`: run's where they mean the same, with check's defaults."""
    return [
        flags_of(
            WhatRuns,
            "backend",
            "strategy",
            "python",
            backend={"help": "backends to check (torch is always the reference)"},
            strategy={
                "help": "comma list (e.g. ddp,fsdp; `list` names every backend's). Default: every strategy "
                "that runs on this hardware, the variants (fsdp) too"
            },
        ),
        flags_of(DevicesRequest, gpus={"default": "1,2", "help": "device counts to compare"}),
        flags_of(NodeRequest, "nodes"),
        flags_of(EquivalenceRequest),
        flags_of(
            RecipeRequest,
            "batch_size",
            "lr",
            "seed",
            "init",
            lr={"default": 0.1, "help": "SGD learning rate"},
            batch_size={"default": 16, "help": "global batch of each step"},
            init={
                "default": "d2l",
                "help": "canonical weights to compare on: d2l (what runs start from) or he (He-scaled kernels)",
            },
        ),
        flags_of(DataRequest, "dataset", "data_dir", "image_size"),
        flags_of(EachRun, "timeout", timeout={"default": 1800.0, "help": "seconds per backend"}),
    ]


def main(args) -> int:
    """`python -m harness check`, its flags parsed (cli.build_parser)."""
    planned = plan_check(request_of(EquivalenceRequest, args, defaults_of(DataRequest)))
    print(planned.devices.line)
    rows, failures, hashes = run_checks(planned.backends, planned.request)
    print()
    print(weights_line(planned, hashes))
    print("\n".join(table(rows)))
    for name, reason in failures.items():
        print(f"{name}: could not be checked: {reason}")
    failed = [r for r in rows if r.status == "FAIL"]
    print(f"\n{len(rows)} rows: " + counts_words(rows))
    return 1 if failed or failures else 0


def weights_line(planned: CheckPlan, hashes: dict[str, str]) -> str:
    """What every row starts from and takes: the weights' hashes, the batches, the learning rate."""
    r = planned.request
    return (
        "Canonical weights: "
        + ", ".join(f"{m} {h[:16]}" for m, h in hashes.items())
        + f" ({r.init} init); {r.steps} batches of {r.batch_size} ({dataset_words(r.dataset)}), "
        f"lr {r.lr:g}, fp32"
    )


def counts_words(rows) -> str:
    said = {
        status: sum(r.status == status for r in rows)
        for status in ("ok", "FAIL", "measured", "not run")
    }
    return f"{said['ok']} ok, {said['FAIL']} failed, {said['measured']} measured, {said['not run']} not run"
