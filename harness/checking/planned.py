"""`check`'s request, typed at the command's door, and its plan: what the check measures (harness/checking/workers.py
`CheckRequest`), refusing bad input in one line before anything starts, as build_plan does for a run.

The flags it shares with `run` are run's (harness/planning/request.py, its nodes' and levers' beside them); the
three of its own are declared here, on their fields."""

from __future__ import annotations

from dataclasses import dataclass, field

from common import manifest
from common.config import (
    BN_MODES,
    MODELS,
    ConfigError,
    check_model_input,
    default_dataset,
    imagenet_shaped,
)
from common.data import imagenet
from common.flags import flag, name_list
from common.manifest import Manifest
from harness.checking.workers import CheckRequest, probe_dataset
from harness.errors import UsageError
from harness.planning.datasets import resolve_data
from harness.planning.plan import (
    Devices,
    check_device_counts,
    choose_devices,
    most_nodes,
    parse_backends,
    parse_gpus,
    parse_pythons,
    select_strategies,
)
from harness.planning.request import DataRequest, check_shared


@dataclass(frozen=True)
class EquivalenceRequest:
    """Every flag of `python -m harness check`, by its name: the backends, devices and nodes to compare, the
    models and BatchNorm modes, and the short trace every one takes."""

    backend: str
    strategy: str | None
    python: list[str]
    device: str
    gpus: str
    nodes: str | None
    batch_size: int
    lr: float
    seed: int
    init: str
    data: DataRequest
    timeout: float
    model: str = field(
        default="lenet,resnet18",
        metadata=flag(
            "comma list of models (resnet50, which takes ImageNet-shaped images, is checked apart, on "
            "synthetic 64x64 images unless --image-size says otherwise)",
            type=name_list,
        ),
    )
    bn: str = field(
        default="local,sync",
        metadata=flag(f"BatchNorm modes: {', '.join(BN_MODES)}", type=name_list),
    )
    steps: int = field(
        default=20,
        metadata=flag(
            "SGD steps in the loss trace; steps x batch size may not exceed the training images",
            type=int,
        ),
    )


@dataclass(frozen=True)
class CheckPlan:
    """What `check` runs: on these devices, these backends' manifests, the one request every backend measures."""

    devices: Devices
    backends: dict[str, Manifest]
    request: CheckRequest


def plan_check(asked: EquivalenceRequest) -> CheckPlan:
    """The check of `asked`, every value checked first; bad input is a UsageError."""
    check_shared(seed=asked.seed, lr=asked.lr, timeout=asked.timeout)
    names = parse_backends(asked.backend)
    if manifest.reference() not in names:
        names.insert(0, manifest.reference())  # the reference every other backend is compared with
    devices = choose_devices(asked.device)
    nodes = most_nodes(asked.nodes)
    counts = per_node_counts(asked, devices, nodes)
    models = chosen_models(asked.model)
    data = checked_data(asked, models)
    bn_modes = chosen_bn_modes(asked.bn)
    check_batch(asked, counts)
    backends = {n: manifest.load(n) for n in names}
    chosen = {
        n: [s for s, reason in picks if reason is None]
        for n, picks in select_strategies(
            asked.strategy, backends, devices.kind, variants=True
        ).items()
    }
    request = CheckRequest(
        models=models,
        strategies=chosen,
        counts=counts,
        bn_modes=bn_modes,
        steps=asked.steps,
        batch_size=asked.batch_size,
        lr=asked.lr,
        seed=asked.seed,
        dataset=probed_dataset(asked, data, models[0]),
        device_kind=devices.kind,
        timeout=asked.timeout,
        init=asked.init,
        nodes=nodes,
        pythons=parse_pythons(asked.python),
    )
    return CheckPlan(devices, backends, request)


def per_node_counts(asked: EquivalenceRequest, devices: Devices, nodes: int) -> list[int]:
    """The global device counts: --gpus is per node."""
    counts = parse_gpus(asked.gpus)
    check_device_counts(counts, devices.kind, devices.gpus, devices.why, nodes)
    return [k * nodes for k in counts]


def chosen_models(text: str) -> list[str]:
    models = [m.strip() for m in text.split(",") if m.strip()]
    if not set(models) <= set(MODELS) or not models:
        raise UsageError(f"--model takes a comma list of {', '.join(MODELS)} (got {text!r})")
    return models


def chosen_bn_modes(text: str) -> list[str]:
    bn_modes = [b.strip() for b in text.split(",") if b.strip()]
    if not set(bn_modes) <= set(BN_MODES) or not bn_modes:
        raise UsageError(f"--bn takes {' and/or '.join(BN_MODES)} (got {text!r})")
    return bn_modes


def checked_data(asked: EquivalenceRequest, models: list[str]) -> DataRequest:
    """The data of the check: the dataset asked for, else the first model's; every model must take its images."""
    data = DataRequest(
        asked.data.dataset or default_dataset(models[0], asked.data.data_dir),
        asked.data.data_dir,
        asked.data.image_size,
    )
    try:
        for model in models:
            check_model_input(model, data.dataset, data.image_size)
    except ConfigError as e:
        raise UsageError(f"{e} (check models that take other images separately)") from None
    return data


def check_batch(asked: EquivalenceRequest, counts: list[int]) -> None:
    if asked.steps < 1:
        raise UsageError(f"--steps must be at least 1 (got {asked.steps})")
    if asked.batch_size < 1 or any(asked.batch_size % n for n in counts):
        raise UsageError(
            f"--batch-size {asked.batch_size} must split evenly across {counts} devices"
        )


def probed_dataset(asked: EquivalenceRequest, data: DataRequest, model: str):
    """The images every step takes, each step its own batch of the first epoch (ImageNet-shaped images are
    synthetic in the check: probe_dataset)."""
    data_dir, _, (train_images, _) = (
        (None, "", imagenet.SIZES) if imagenet_shaped(data.dataset) else resolve_data(data)
    )
    needed = asked.steps * asked.batch_size
    if needed > train_images:
        raise UsageError(
            f"--steps {asked.steps} x --batch-size {asked.batch_size} needs more than the "
            f"{train_images} training images of {data.dataset}"
        )
    return probe_dataset(data.dataset, data_dir, needed, model, data.image_size, asked.seed)
