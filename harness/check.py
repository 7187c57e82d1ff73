"""`python -m harness check`: show, with numbers, that the backends compute the same thing.

On one set of canonical weights (one file, one hash) and the same batches, every selected
backend, strategy and device count measures (common/measurements.py, inside its environment):
forward logits, the first batch's loss and gradients after the allreduce, the weights
after one SGD step, and the loss of every step of a short trace. The harness compares
them with torch's (harness/checking/equivalence.py) and prints one table; the exit status is 1 if any row fails.
"""

from __future__ import annotations

from common import manifest
from common.config import MODELS, ConfigError, check_model_input, default_dataset, imagenet_shaped
from common.data import imagenet
from harness import arguments
from harness.checking.equivalence import table
from harness.checking.workers import CheckRequest, dataset_words, probe_dataset, run_checks
from harness.errors import UsageError
from harness.planning.datasets import resolve_data
from harness.planning.plan import (
    check_device_counts,
    choose_devices,
    most_nodes,
    parse_backends,
    parse_gpus,
    parse_pythons,
    select_strategies,
)
from harness.planning.request import DataRequest, check_shared

# ------------------------------------------------------------------------- command

DESCRIPTION = (
    "Compare forward passes, gradients, SGD steps and k-vs-1-device training across backends and "
    "strategies on one set of canonical weights; exit 1 on any failure."
)


def parents() -> list[arguments.Parser]:
    """The flag groups of `python -m harness check` (shared with `run` where they mean the same)."""
    own = arguments.Parser(add_help=False)
    own.add_argument(
        "--model",
        type=arguments.name_list,
        default="lenet,resnet18",
        help="comma list of models (resnet50, which takes ImageNet-shaped images, is checked apart, on "
        "synthetic 64x64 images unless --image-size says otherwise)",
    )
    own.add_argument(
        "--bn", type=arguments.name_list, default="local,sync", help="BatchNorm modes: local, sync"
    )
    own.add_argument(
        "--steps",
        type=int,
        default=20,
        help="SGD steps in the loss trace; steps x batch size may not exceed the training images",
    )
    return [
        arguments.backends_flags("backends to check (torch is always the reference)"),
        arguments.devices_flags("1,2", "device counts to compare"),
        arguments.nodes_flags(hosts=False),
        own,
        arguments.training_flags(
            0.1,
            "SGD learning rate",
            16,
            "global batch of each step",
            "canonical weights to compare on: d2l (what runs start from) or he (He-scaled kernels)",
        ),
        arguments.data_flags(),
        arguments.python_flags(),
        arguments.timeout_flags(1800.0, "seconds per backend"),
    ]


def main(args) -> int:
    """`python -m harness check`, its flags parsed (cli.build_parser)."""
    check_shared(seed=args.seed, lr=args.lr, timeout=args.timeout)

    names = parse_backends(args.backend)
    if manifest.reference() not in names:
        names.insert(0, manifest.reference())  # the reference every other backend is compared with
    devices = choose_devices(args.device)
    kind = devices.kind
    counts = parse_gpus(args.gpus)
    nodes = most_nodes(args.nodes)
    check_device_counts(counts, kind, devices.gpus, devices.why, nodes)
    counts = [k * nodes for k in counts]  # --gpus is per node
    models = [m.strip() for m in args.model.split(",") if m.strip()]
    bn_modes = [b.strip() for b in args.bn.split(",") if b.strip()]
    if not set(models) <= set(MODELS) or not models:
        raise UsageError(f"--model takes a comma list of {', '.join(MODELS)} (got {args.model!r})")
    data = DataRequest(
        args.dataset or default_dataset(models[0], args.data_dir), args.data_dir, args.image_size
    )
    try:
        for model in models:
            check_model_input(model, data.dataset, data.image_size)
    except ConfigError as e:
        raise UsageError(f"{e} (check models that take other images separately)") from None
    if not set(bn_modes) <= {"local", "sync"} or not bn_modes:
        raise UsageError(f"--bn takes local and/or sync (got {args.bn!r})")
    if args.steps < 1:
        raise UsageError(f"--steps must be at least 1 (got {args.steps})")
    if args.batch_size < 1 or any(args.batch_size % n for n in counts):
        raise UsageError(
            f"--batch-size {args.batch_size} must split evenly across {counts} devices"
        )
    backends = {n: manifest.load(n) for n in names}
    chosen = {
        n: [s for s, reason in picks if reason is None]
        for n, picks in select_strategies(args.strategy, backends, kind).items()
    }
    # (ImageNet-shaped images are synthetic in the check: probe_dataset)
    data_dir, _, (train_images, _) = (
        (None, "", imagenet.SIZES) if imagenet_shaped(data.dataset) else resolve_data(data)
    )
    # each step takes its own batch of the first epoch
    if args.steps * args.batch_size > train_images:
        raise UsageError(
            f"--steps {args.steps} x --batch-size {args.batch_size} needs more than the "
            f"{train_images} training images of {data.dataset}"
        )
    dataset = probe_dataset(
        data.dataset, data_dir, args.steps * args.batch_size, models[0], data.image_size, args.seed
    )

    print(devices.line)
    request = CheckRequest(
        models=models,
        strategies=chosen,
        counts=counts,
        bn_modes=bn_modes,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        dataset=dataset,
        device_kind=kind,
        timeout=args.timeout,
        init=args.init,
        nodes=nodes,
        pythons=parse_pythons(args.python),
    )
    rows, failures, hashes = run_checks(backends, request)
    print()
    print(
        "Canonical weights: "
        + ", ".join(f"{m} {h[:16]}" for m, h in hashes.items())
        + f" ({args.init} init); {args.steps} batches of {args.batch_size} ({dataset_words(dataset)}), "
        f"lr {args.lr:g}, fp32"
    )
    print("\n".join(table(rows)))
    for name, reason in failures.items():
        print(f"{name}: could not be checked: {reason}")
    failed = [r for r in rows if r.status == "FAIL"]
    print(
        f"\n{len(rows)} rows: {sum(r.status == 'ok' for r in rows)} ok, {len(failed)} failed, "
        f"{sum(r.status == 'measured' for r in rows)} measured, {sum(r.status == 'not run' for r in rows)} not run"
    )
    return 1 if failed or failures else 0
