"""The check's workers: each backend's check worker run in its environment (through runner.launch, on one process
or on loopback nodes), on one set of canonical weights and batches written here, its measurements read back as
untrusted input and compared with torch's (equivalence.py); and the small check a benchmark report holds
(`equivalence`). `python -m harness check` (harness/check.py) and the benchmark session both run it."""

from __future__ import annotations

import json
import math
import tempfile
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from common import architectures, manifest
from common import data as datalib
from common import weights as weightslib
from common.checkjob import CheckJob, MeasurementKey
from common.config import imagenet_shaped
from common.data import imagenet
from common.manifest import Manifest
from common.measurement_files import MeasurementFile
from common.network import free_port
from harness.checking.equivalence import CheckRow, Measurements, compare, compare_nodes, table
from harness.planning.plan import Plan
from harness.processes import disk, envs, runner


class CheckError(Exception):
    """A backend's measurements could not be taken; the message says why."""


# ------------------------------------------------------------------------ inputs


@dataclass(frozen=True)
class SharedFiles:
    """The part of the job all backends share: each model's canonical weights file (and its fingerprint) and the
    batches file."""

    weights: dict[str, str]  # model -> file
    batches: str
    weights_hash: dict[str, str]  # model -> fingerprint


def prepare(tmp: Path, request: CheckRequest) -> SharedFiles:
    """Write the canonical weights of each model and `request.steps` batches."""
    weights = {}
    for model in request.models:
        path = tmp / f"{model}-{request.init}-seed{request.seed}.npz"
        weightslib.save(path, weightslib.initial_weights(model, request.seed, request.init))
        weights[model] = str(path)
    steps, batch_size, dataset = request.steps, request.batch_size, request.dataset
    batches = list(datalib.train_batches(dataset, batch_size, request.seed, 0))[:steps]
    if len(batches) < steps:
        raise CheckError(
            f"{steps} batches of {batch_size} need more than the {len(dataset.y_train)} training images"
        )
    np.savez(
        tmp / "batches.npz",
        x=np.stack([b[0] for b in batches]),
        y=np.stack([b[1] for b in batches]),
    )
    return SharedFiles(
        weights=weights,
        batches=str(tmp / "batches.npz"),
        weights_hash={m: weightslib.fingerprint(weightslib.load(p)) for m, p in weights.items()},
    )


@dataclass(frozen=True)
class Worker:
    """Where one backend's check worker runs: its interpreter, the folder of its job and measurements, its
    deadline in seconds, and the folder of its logs."""

    name: str
    python: str
    tmp: Path
    timeout: float
    log_dir: Path

    def command(self, job_path: Path, out: Path) -> list[str]:
        return [
            self.python,
            "-m",
            f"backends.{self.name}",
            "--check",
            str(job_path),
            "--result",
            str(out),
        ]


def measure(worker: Worker, job: CheckJob) -> Measurements:
    """Run the backend's check worker (runner.launch: its own process group, killed whole on timeout or
    interrupt, its output logged); its arrays and what it could not run."""
    name, tmp = worker.name, worker.tmp
    job_path, out = tmp / f"{name}.job.json", tmp / f"{name}.npz"
    log_path = worker.log_dir / f"check-{name}.log"
    write_job(name, job_path, job, log_path.parent)
    try:
        returncode, output = runner.launch(
            worker.command(job_path, out), envs.worker_env(), log_path, worker.timeout
        )
    except OSError as e:
        raise CheckError(f"{name}: could not start {worker.python}: {e}") from None
    if returncode is None:
        raise CheckError(f"{name}: no answer within {worker.timeout:g} s")
    if returncode or not out.exists():
        tail = "".join(output).strip().splitlines()[-1:] or ["no output"]
        raise CheckError(f"{name} worker failed: {tail[0]}")
    return worker_output(out)


def measure_nodes(worker: Worker, job: CheckJob, nodes: int) -> Measurements:
    """The job on `nodes` loopback nodes (check workers started together, joined at a free 127.0.0.1 port):
    node 0's arrays and what it could not run, or CheckError with the first failing node's last line."""
    name, tmp = worker.name, worker.tmp
    coordinator = f"127.0.0.1:{free_port()}"
    cmds, logs, outs = [], [], []
    for rank in range(nodes):
        job_path, out = (
            tmp / f"{name}.nodes{nodes}.{rank}.job.json",
            tmp / f"{name}.nodes{nodes}.{rank}.npz",
        )
        logs.append(worker.log_dir / f"check-{name}-{nodes}nodes.node{rank}.log")
        node = replace(job, nodes=nodes, node_rank=rank, coordinator=coordinator)
        write_job(name, job_path, node, logs[0].parent)
        cmds.append(worker.command(job_path, out))
        outs.append(out)
    try:
        ended = runner.launch_all(
            cmds,
            envs.worker_env(),
            logs,
            worker.timeout,
            grace=runner.NODE_GRACE_S,
            failed_grace=runner.FAILED_NODE_GRACE_S,
        )
    except OSError as e:
        raise CheckError(f"{name}: could not start {worker.python}: {e}") from None
    failed = sorted(
        (at, rank, code, output)
        for rank, (code, output, at) in enumerate(ended)
        if code != 0 or not outs[rank].exists()
    )
    if failed:
        _, rank, code, output = failed[0]
        last = "".join(output).strip().splitlines()[-1:] or ["no output"]
        why = "no answer within the timeout" if code is None else last[0]
        raise CheckError(f"{name} on {nodes} nodes: node {rank} failed: {why}")
    return worker_output(outs[0])


def write_job(name: str, path: Path, job: CheckJob, log_dir: Path) -> None:
    """A worker's job file and its log folder; a full disk or an unwritable folder is this backend's CheckError."""
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(job.to_json())
    except OSError as e:
        raise CheckError(f"{name}: {disk.not_written(path, e)}") from None


def worker_output(out: Path) -> Measurements:
    """A check worker's measurements and the list of what it could not run (its `.skipped.json`), both
    untrusted: a file that cannot be read is a CheckError."""
    skipped = Path(str(out) + ".skipped.json")
    try:
        reasons = json.loads(skipped.read_text())
    except (OSError, ValueError) as e:
        raise CheckError(f"unreadable {skipped.name}: {e}") from None
    if not isinstance(reasons, dict) or not all(isinstance(v, str) for v in reasons.values()):
        raise CheckError(f"unreadable {skipped.name}: not a JSON object of reasons")
    for key in reasons:
        try:
            MeasurementKey.parse(key)
        except ValueError as e:
            raise CheckError(f"unreadable {skipped.name}: {e}") from None
    return Measurements(measurements(out), reasons)


def measurements(path: Path) -> MeasurementFile:
    """A worker's measurements, read lazily: each array is read from the file when a comparison asks for it, and
    dropped after (equivalence._gap), so the harness never holds every backend's arrays at once (a ResNet-50
    check's are gigabytes). The file stays open until the comparison is done (run_checks closes it)."""
    try:
        return MeasurementFile(path)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise CheckError(f"unreadable measurements in {path.name}: {e}") from None


# ------------------------------------------------------------------------------ run


@dataclass(frozen=True)
class CheckRequest:
    """What the check measures, the same for every backend: the models, each backend's strategies, the device
    counts and BatchNorm modes, and the steps every one takes from the same weights and batches."""

    models: list[str]
    # {backend: its strategies}; a backend without any is not measured
    strategies: dict[str, list[str]]
    counts: list[int]  # global device counts
    bn_modes: list[str]
    steps: int
    batch_size: int
    lr: float
    seed: int
    dataset: datalib.Dataset
    device_kind: str
    timeout: float  # seconds per backend
    init: str = "d2l"
    nodes: int = 1
    # {backend: interpreter} in place of its environment's
    pythons: dict[str, str] = field(default_factory=dict)

    def job(self, name: str, files: SharedFiles) -> CheckJob:
        """Backend `name`'s job: its strategies on the device counts asked for and on 1 device (the 1-device runs
        are the references of the float32 floor, the own-float32 rows and k vs 1: always measured); torch, the
        reference, measures its float64 runs too."""
        return CheckJob(
            models=tuple(self.models),
            strategies=tuple(self.strategies[name]),
            devices=tuple(sorted(set(self.counts) | {1})),
            bn=tuple(self.bn_modes),
            lr=self.lr,
            device_kind=self.device_kind,
            float64=name == manifest.reference(),
            weights=files.weights,
            batches=files.batches,
        )


def run_checks(
    backends: dict[str, Manifest], request: CheckRequest, say=print, log_dir: Path | None = None
):
    """Measure every backend and compare; (rows, {backend: reason it could not be measured}, weights hashes).
    With `request.nodes` > 1, each backend's strategies that have an engine are measured again on that many nodes
    (`request.counts` global devices) and compared with their 1-process runs."""
    failures, results, node_runs = {}, {}, {}
    counts, nodes = request.counts, request.nodes
    with tempfile.TemporaryDirectory() as tmp:
        try:
            files = prepare(Path(tmp), request)
        except OSError as e:  # the temporary folder's disk is full, say: no backend can be measured
            why = disk.not_written(tmp, e)
            return [], {name: why for name in backends}, {}
        for name, backend in backends.items():
            strategies = request.strategies.get(name)
            if not strategies:
                continue
            job = request.job(name, files)
            say(
                f"[check] {name}: {', '.join(strategies)} x {','.join(map(str, counts))}, "
                f"{'/'.join(request.models)}, bn {'/'.join(request.bn_modes)}"
            )
            try:
                python = request.pythons.get(name) or str(
                    envs.ensure_backend(name, backend.requirements, say=say)
                )
                worker = Worker(name, python, Path(tmp), request.timeout, log_dir or Path(tmp))
                results[name] = measure(worker, job)
            except (CheckError, envs.EnvError) as e:
                failures[name] = str(e).splitlines()[0]
                continue
            engines = [s for s in strategies if backend.strategies[s].engine]
            multi = [k for k in counts if k % nodes == 0]
            if nodes > 1 and engines and multi:
                say(
                    f"[check] {name}: {', '.join(engines)} on {nodes} nodes x {','.join(map(str, multi))} devices"
                )
                on_nodes = replace(
                    job, strategies=tuple(engines), devices=tuple(multi), float64=False
                )
                try:
                    node_runs[name] = measure_nodes(worker, on_nodes, nodes)
                except CheckError as e:
                    failures[f"{name} on {nodes} nodes"] = str(e).splitlines()[0]
        w0 = {m: weightslib.load(p) for m, p in files.weights.items()}
        try:
            ref = manifest.reference()
            if ref not in results:
                failures = {
                    **failures,
                    ref: failures.get(ref, f"not measured: {ref} is the reference"),
                }
                return [], failures, files.weights_hash
            rows = asked_rows(compare(results, w0, ref), counts)
            for name, multi_run in node_runs.items():
                single, reference = results[name].arrays, results[ref].arrays
                rows += compare_nodes(name, single, multi_run, nodes, w0, reference)
            return rows, failures, files.weights_hash
        finally:
            for arrays, _ in [*results.values(), *node_runs.values()]:
                # (the open files of measurements(); a plain dict has nothing to close)
                if hasattr(arrays, "close"):
                    arrays.close()


def asked_rows(rows: list[CheckRow], counts: list[int]) -> list[CheckRow]:
    """The rows of the device counts asked for (a 1-device reference measured only as a reference is not shown),
    and the 1-device rows that concern the backend as a whole (forward, float64 gradients, own float32)."""
    whole = ("forward", "math (float64)", "float32 vs float64")
    return [r for r in rows if r.check in whole or int(r.devices) in counts]


# ResNet-50's last stage sees side / 32 pixels a side: at 32 px its BatchNorms normalise over one value per image,
# and the gradients of a small batch then grow so large (1e9) that float64 rounding alone moves them by 1e-10. At
# 64 px they take four per image, and two implementations of the same math agree to 1e-13.
CHECK_SIDE = 64


def dataset_words(dataset: datalib.Dataset) -> str:
    return dataset.name if dataset.name == "fashion-mnist" else dataset.source


def probe_dataset(
    dataset: str, data_dir: str | None, n: int, model: str, side: int | None, seed: int
) -> datalib.Dataset:
    """`n` training images for the check's batches (and 10 test images). ImageNet-shaped ones are synthetic, at
    `side` px (default CHECK_SIDE): the check proves the math, which is that of any image side, and keeps its
    float64 references (on the CPU) small."""
    if dataset == "synthetic":
        return datalib.synthetic(n, 10, seed)
    if imagenet_shaped(dataset):
        return imagenet.synthetic(
            n, 10, side or max(CHECK_SIDE, architectures.smallest_image_size(model)), seed
        )
    return datalib.load_fashion_mnist(Path(data_dir), n, 10)


def equivalence(plan: Plan, say, log_dir: Path | None = None) -> dict:
    """A small check over what a benchmark report runs, for its Equivalence section."""
    counts = sorted({c.devices for c in plan.configs}) or [1]
    strategies = {}
    for c in plan.configs:
        strategies.setdefault(c.backend, [])
        if c.strategy not in strategies[c.backend]:
            strategies[c.backend].append(c.strategy)
    backends = dict(plan.backends)
    # the reference every backend is compared with, as `check` adds it, with its declared strategy (torch's ddp: on
    # CPU and GPU, with either --bn)
    ref = manifest.load(manifest.reference())
    if ref.name not in strategies:
        backends[ref.name] = ref
        strategies = {ref.name: [ref.framework.reference_strategy], **strategies}
    steps, batch = 5, 8 * math.lcm(*counts)
    cfg = plan.configs[0] if plan.configs else None
    if cfg is None:
        return {}
    dataset = probe_dataset(cfg.dataset, cfg.data_dir, steps * batch, cfg.model, None, cfg.seed)
    # Nodes on other hosts are busy with their own check: the check across nodes runs on loopback nodes only.
    nodes = max(c.nodes.count for c in plan.configs) if plan.topology.loopback else 1
    request = CheckRequest(
        models=[cfg.model],
        strategies=strategies,
        counts=counts,
        bn_modes=[cfg.bn],
        steps=steps,
        batch_size=batch,
        lr=0.1,
        seed=cfg.seed,
        dataset=dataset,
        device_kind=plan.device_kind,
        timeout=cfg.timeout,
        init=cfg.init,
        nodes=nodes,
        pythons=plan.pythons,
    )
    rows, failures, hashes = run_checks(backends, request, say=say, log_dir=log_dir)
    return {
        "rows": [r.__dict__ for r in rows],
        "failures": failures,
        "weights_hash": hashes,
        "setup": f"{cfg.model} ({cfg.init} init), {steps} steps of batch {batch} ({dataset_words(dataset)}), lr 0.1, "
        f"float32, bn {cfg.bn}",
        "table": table(rows),
    }
