"""The run config: everything one worker run needs, validated, and carried as JSON.

The harness builds one RunConfig per (backend, strategy, device count), writes it to a
file, and the backend's worker reads it back. Nothing here imports a framework.
"""

from __future__ import annotations

import json
import math
import typing
from dataclasses import asdict, dataclass, field, fields, replace

from common import architectures
from common.errors import ConfigError
from common.levers import Levers
from common.nodes import NodeSpec, is_number

MODELS = ("resnet18", "lenet", "resnet50")
BN_MODES = ("local", "sync")
INITS = ("d2l", "he")  # the initialisers of common/weights.py
# --profile: a trace of more steps only grows (gzipped, 20-140 KB a ResNet-18 step on the CPU, by framework)
MAX_PROFILE_STEPS = 50
# --gpus on the CPU: the simulated devices a backend provides (XLA's are made at import)
MAX_SIMULATED_DEVICES = 16
# (channels, classes) of each dataset's images; a model takes the datasets of its own input (architectures.INPUTS).
DATASET_INPUTS = {
    "fashion-mnist": (1, 10),
    "synthetic": (1, 10),
    "imagenet": (3, 1000),
    "imagenet-synthetic": (3, 1000),
}
DATASETS = tuple(DATASET_INPUTS)
MAX_IMAGE_SIZE = 1024  # --image-size: ImageNet-shaped images are resized to this side at most
MAX_SEED = 2**32 - 1  # numpy's SeedSequence and every framework's seed accept 0..2**32-1
# A fixed bound, not one derived from this host's cores: a config must mean the same on every host (the
# worker validates it again). 1024 is above the hardware threads of any current CPU; far larger counts
# make the frameworks' thread pools crash instead of failing cleanly.
MAX_THREADS = 1024


# Checks shared by the run config and `harness check`, so both commands refuse the same values.


def check_seed(seed) -> None:
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"--seed must be between 0 and {MAX_SEED} (got {seed})")


def check_lr(lr) -> None:
    if not is_number(lr) or not math.isfinite(lr) or lr <= 0:
        raise ConfigError(f"--lr must be positive and finite (got {lr})")


def check_timeout(timeout) -> None:
    # inf or nan would switch the timeout off silently (a nan deadline never passes)
    if not is_number(timeout) or not math.isfinite(timeout) or timeout <= 0:
        raise ConfigError(f"--timeout must be positive and finite, in seconds (got {timeout})")


def check_threads(threads) -> None:
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise ConfigError(f"--threads must be between 1 and {MAX_THREADS} (got {threads})")


def imagenet_shaped(dataset: str) -> bool:
    # (an unknown name: an old or altered results.json)
    return DATASET_INPUTS.get(dataset, (1,))[0] == 3


def image_side(model: str, dataset: str, image_size: int | None) -> int:
    """The side of the square images a run trains on: Fashion-MNIST's 28, else --image-size or the model's."""
    if not imagenet_shaped(dataset):
        return 28
    return image_size or architectures.default_image_size(model)


def default_dataset(model: str, data_dir: str | None) -> str:
    """The dataset `model` trains on when none is named: its real one (Fashion-MNIST, found by itself; an
    ImageNet-layout folder only with --data-dir), else ImageNet-shaped synthetic images."""
    real, *_, synthetic = datasets_for(model)
    return real if data_dir or not imagenet_shaped(real) else synthetic


def datasets_for(model: str) -> list[str]:
    """The datasets whose images `model` takes."""
    shape = (architectures.in_channels(model), architectures.num_classes(model))
    return [name for name, inputs in DATASET_INPUTS.items() if inputs == shape]


def check_model_input(model: str, dataset: str, image_size: int | None) -> None:
    """The model takes the dataset's images (channels and classes), at a side it accepts."""
    if dataset not in datasets_for(model):
        raise ConfigError(
            f"--model {model} does not take {dataset} images; choose --dataset from "
            f"{', '.join(datasets_for(model))}"
        )
    if image_size is None:
        return
    if not imagenet_shaped(dataset):
        raise ConfigError(
            f"--image-size applies to ImageNet-shaped datasets; {dataset} images are 28x28"
        )
    smallest = architectures.smallest_image_size(model)
    if (
        not isinstance(image_size, int)
        or isinstance(image_size, bool)
        or not smallest <= image_size <= MAX_IMAGE_SIZE
    ):
        raise ConfigError(
            f"--image-size must be between {smallest} and {MAX_IMAGE_SIZE} for {model} "
            f"(got {image_size})"
        )


@dataclass
class RunConfig:
    """One worker run. Its speed levers and its nodes are groups of their own (`levers`, `nodes`); results.json and
    the worker's config file hold it flat, every field by its name there (`to_dict`, `from_dict`)."""

    backend: str
    strategy: str
    devices: int  # data-parallel replicas
    device_kind: str = "cpu"  # "gpu" or "cpu"
    simulated: bool = True  # CPU devices standing in for GPUs
    model: str = "resnet18"
    epochs: int = 2
    batch_size: int = 256  # global batch, split evenly across the devices (as d2l)
    lr: float = 0.1
    train_size: int | None = None  # None: the whole split
    test_size: int | None = None
    eval_batch_size: int = 1000
    dataset: str = "fashion-mnist"
    # Fashion-MNIST's files, or the prepared ImageNet-layout images (common/data/)
    data_dir: str | None = None
    # the side of ImageNet-shaped images (None: the model's, 224); Fashion-MNIST is 28
    image_size: int | None = None
    seed: int = 0
    # the seed of the batch order alone (None: `seed`'s): with --target-accuracy and --repeat, each trial after the
    # first trains on an order of its own from the same initial weights (harness/planning/plan.py Plan.runs)
    order_seed: int | None = None
    timeout: float = 3600.0
    threads: int | None = None  # CPU threads per process; None: the framework's default
    # Backend-specific options declared in backends/<name>/backend.toml, e.g. {"kvstore": "device"};
    # the harness fills in every declared default, so a result records exactly what ran.
    options: dict[str, str] = field(default_factory=dict)
    # BatchNorm across devices: "local" (each device its own shard's statistics, as the seeds do)
    # or "sync" (statistics over the global batch: k-device training is 1-device training).
    bn: str = "local"
    # initial weights when none are loaded: d2l's or He-scaled (common/weights.py)
    init: str = "d2l"
    levers: Levers = field(
        default_factory=Levers
    )  # precision, compile, channels-last, ... (common/levers.py)
    # The folder every framework keeps its compile cache in, shared by every run (--compile-cache); None: each
    # run starts its caches cold, in a folder of its own (common/caches.py).
    compile_cache: str | None = None
    timed_steps: int = 20  # steady-state steps timed one by one after training (step statistics)
    # --target-accuracy: stop after the first epoch whose test accuracy reaches it (--epochs is the cap); None: train
    # every epoch
    target_accuracy: float | None = None
    # steps recorded with the framework's profiler after everything timed (--profile; 0: none): common/profiling.py
    profile: int = 0
    # --profile-epoch: the profiled steps run as an epoch runs them (barriers only around the stretch), so the trace
    # shows the input path; else each between two barriers, as a timed step
    profile_epoch: bool = False
    # measure the framework's matmul peak on this host after training (the harness asks it of one run per backend)
    measure_peak: bool = False
    # the nodes the run spans and this one's place among them (common/nodes.py)
    nodes: NodeSpec = field(default_factory=NodeSpec)
    # start from this canonical weights file instead of the seeded init
    load_weights: str | None = None
    save_weights: str | None = None  # write the canonical weights here after training

    @property
    def engine_timeout(self) -> float:
        """Across nodes, the longest an engine may wait on a peer (a collective, a heartbeat): the second line
        behind the harness's heartbeats (harness/nodes/watch.py), which name a lost node within peer_timeout, so
        twice that, and never more than the run's timeout."""
        return min(self.timeout, 2 * self.nodes.peer_timeout)

    @property
    def variant(self) -> str:
        """The strategy with its options and levers, e.g. `gluon[kvstore=local]`, `ddp[bf16,compile]`:
        one row of a report."""
        opts = [f"{k}={v}" for k, v in sorted(self.options.items())] + self.levers.on
        return f"{self.strategy}[{','.join(opts)}]" if opts else self.strategy

    @property
    def image_side(self) -> int:
        """The side of the square images this run trains on."""
        return image_side(self.model, self.dataset, self.image_size)

    @property
    def batch_seed(self) -> int:
        """The seed of the batch order: order_seed where given, else the run's seed."""
        return self.seed if self.order_seed is None else self.order_seed

    @property
    def per_device_batch(self) -> int:
        return self.batch_size // self.devices

    @property
    def local_devices(self) -> int:
        """The devices of this node (all of them with one node)."""
        return self.devices // self.nodes.count

    @property
    def first_gpu(self) -> int:
        """This node's first GPU on its host: loopback nodes share the host's GPUs (node r has [r*L, (r+1)*L)),
        a node on a host of its own starts at 0."""
        return self.nodes.rank * self.local_devices if self.nodes.loopback else 0

    def with_levers(self, **changes) -> RunConfig:
        """This run with some of its levers changed."""
        return replace(self, levers=replace(self.levers, **changes))

    def with_nodes(self, **changes) -> RunConfig:
        """This run with some of its nodes' fields changed (NodeSpec's names)."""
        return replace(self, nodes=replace(self.nodes, **changes))

    def validate(self) -> RunConfig:
        self._check_recipe()
        self._check_devices()
        self._check_sizes()
        self._check_run()
        check_lr(self.lr)
        check_seed(self.seed)
        if self.order_seed is not None:
            check_seed(self.order_seed)
        check_timeout(self.timeout)
        check_threads(self.threads)
        self.levers.validate()
        self.nodes.validate()
        if self.devices % self.nodes.count:
            raise ConfigError(
                f"{self.devices} devices cannot be split evenly across {self.nodes.count} nodes"
            )
        return self

    def _check_recipe(self) -> None:
        """What is trained, on what, from what."""
        if self.model not in MODELS:
            raise ConfigError(f"unknown model {self.model!r}; choose from {', '.join(MODELS)}")
        if self.dataset not in DATASETS:
            raise ConfigError(
                f"unknown dataset {self.dataset!r}; choose from {', '.join(DATASETS)}"
            )
        check_model_input(self.model, self.dataset, self.image_size)
        if self.epochs < (0 if self.load_weights else 1):
            raise ConfigError(
                f"--epochs must be at least 1 (got {self.epochs}); "
                "0 evaluates the weights given with --load-weights"
            )
        if self.init not in INITS:
            raise ConfigError(f"unknown --init {self.init!r}; choose from {', '.join(INITS)}")
        if self.bn not in BN_MODES:
            raise ConfigError(f"unknown --bn {self.bn!r}; choose from {', '.join(BN_MODES)}")

    def _check_devices(self) -> None:
        """The devices, and the global batch split evenly across them."""
        if self.devices < 1:
            raise ConfigError(f"--gpus must be at least 1 (got {self.devices})")
        if self.device_kind not in ("cpu", "gpu"):
            raise ConfigError(f"unknown device kind {self.device_kind!r}")
        if self.batch_size < self.devices:
            raise ConfigError(
                f"--batch-size {self.batch_size} is smaller than the {self.devices} devices"
            )
        if self.batch_size % self.devices:
            raise ConfigError(
                f"--batch-size {self.batch_size} cannot be split evenly across "
                f"{self.devices} devices (use a multiple of {self.devices})"
            )

    def _check_sizes(self) -> None:
        """The subsets of the data, each at least one image, the training one at least one batch."""
        for name in ("train_size", "test_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1 (got {value})")
        if self.train_size is not None and self.train_size < self.batch_size:
            raise ConfigError(
                f"--train-size {self.train_size} is smaller than one batch ({self.batch_size})"
            )

    def _check_run(self) -> None:
        """How the run ends and what it records beside its training."""
        if self.compile_cache is not None and not self.compile_cache.startswith("/"):
            raise ConfigError(
                f"--compile-cache takes an absolute folder (got {self.compile_cache!r})"
            )
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ConfigError(
                f"--target-accuracy must be a test accuracy in (0, 1] (got {self.target_accuracy})"
            )
        if self.timed_steps < 0:
            raise ConfigError(f"--timed-steps must be at least 0 (got {self.timed_steps})")
        if not 0 <= self.profile <= MAX_PROFILE_STEPS:
            raise ConfigError(
                f"--profile must be between 0 and {MAX_PROFILE_STEPS} steps (got {self.profile})"
            )

    def to_dict(self) -> dict:
        """Flat, as results.json and the worker's config file hold it: the groups' fields in their place."""
        flat = {}
        for name, value in asdict(self).items():
            flat.update(getattr(self, name).flat() if name in GROUPS else {name: value})
        return flat

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        """From the flat form of to_dict; keys it does not know (an older or newer results.json's) are left out."""
        known = {f.name for f in fields(cls)} - set(GROUPS)
        return cls(
            **{k: v for k, v in d.items() if k in known},
            **{name: group.from_flat(d) for name, group in GROUPS.items()},
        )

    def save(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2)

    @classmethod
    def load(cls, path) -> RunConfig:
        with open(path) as f:
            return cls.from_dict(json.load(f)).validate()


# RunConfig's fields that are groups of their own, held flat in results.json
GROUPS = {"levers": Levers, "nodes": NodeSpec}


def flat_hints() -> dict:
    """results.json's config keys with their types, in to_dict's order: what its readers check a config against
    (common/results.py) and its schema says (common/schema.py)."""
    hints = {}
    for name, hint in typing.get_type_hints(RunConfig).items():
        if name not in GROUPS:
            hints[name] = hint
            continue
        group = GROUPS[name]
        group_hints = typing.get_type_hints(group)
        hints.update(zip(group().flat(), (group_hints[f.name] for f in fields(group))))
    return hints
