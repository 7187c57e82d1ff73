"""PyTorch-only behaviour: DDP failure handling, dp refusal, what the levers do in torch (channels-last's memory
format, compile's wrappers and modes, the recorded layout), batches placed ahead of their step, the scratch update,
cuDNN autotuning, the model's FLOPs, CUDA, and ddp across two hosts under Slurm. Identity of math is proven in
float64 (numerics.IDENTICAL); a float32 claim is judged against float32's own distance from float64, measured in
the same test. What every backend does, the levers' steps, records and refusals included, is proven in
test_contract.py."""

from __future__ import annotations

import os

import numpy as np
import pytest

from common.backend import Probe
from common.levers import Levers
from tests.backends.conftest import NAME, run_backend_worker
from tests.backends.hosts import run_row, small_run, start_harness, two_hosts, wait_all
from tests.backends.numerics import IDENTICAL, max_abs_diff, relative

pytestmark = pytest.mark.skipif(NAME != "torch", reason="torch backend only")


def children_of(pid: int) -> list[int]:
    """The live (not zombie) child processes of `pid`."""
    kids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            kids.append(int(entry))
    return kids


def rank_processes_of(pid: int) -> list[int]:
    """The live ranks of `pid`'s launches: the children of its multiprocessing forkserver (the server lives as
    long as `pid` does, and the resource tracker is no rank)."""
    servers = []
    for kid in children_of(pid):
        try:
            with open(f"/proc/{kid}/cmdline", "rb") as f:
                if b"multiprocessing.forkserver" in f.read():
                    servers.append(kid)
        except OSError:
            continue
    return [rank for server in servers for rank in children_of(server)]


def fail_on_rank_1(cfg, rank, payload):
    """Rank 1 raises; rank 0 waits in a collective that will never complete."""
    import torch.distributed as dist

    if rank == 1:
        raise ValueError("planted failure in rank 1")
    dist.barrier()
    return "unreachable"


def test_a_failing_rank_fails_the_run_with_its_error_and_leaves_no_process():
    """The agent's error files name the first failure, the cause (rank 1's exception, with its traceback),
    not rank 0's echo of it; the agent stops every rank."""
    from backends.torch.distributed import launch_ddp
    from common.config import RunConfig

    cfg = RunConfig(
        backend="torch", strategy="ddp", devices=2, batch_size=8, timeout=120
    ).validate()
    assert rank_processes_of(os.getpid()) == []
    with pytest.raises(RuntimeError) as info:
        launch_ddp(cfg, fail_on_rank_1)
    assert str(info.value).startswith(
        "DDP rank 1 (node 0) failed: ValueError: planted failure in rank 1"
    )
    assert "in fail_on_rank_1" in str(info.value)  # the traceback from the rank's error file
    assert rank_processes_of(os.getpid()) == []


def test_dataparallel_is_refused_without_cuda(backend):
    import torch

    from common.errors import Unsupported

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(Unsupported, match="needs CUDA"):
        backend.train_steps(
            Probe("dp", "lenet", 1),
            backend.initial_weights("lenet", 0),
            [(np.zeros((2, 1, 28, 28), np.float32), np.zeros(2, np.int32))],
            0.1,
        )


def run_worker(tmp_path, **overrides) -> tuple[int, dict]:
    return run_backend_worker(tmp_path, **{"strategy": "ddp", **overrides})


# ------------------------------------------------------------------ levers and the loop's trainer methods


def image_batches(n_steps=1, size=8):
    rng = np.random.default_rng(0)
    return [
        (
            rng.random((size, 1, 28, 28), dtype=np.float32),
            rng.integers(0, 10, size).astype(np.int32),
        )
        for _ in range(n_steps)
    ]


def scratch_trainer(backend, devices=2, batch_size=8, device_kind="cpu", simulated=True, **levers):
    """A scratch trainer of LeNet, as built (not reset)."""
    from backends.torch.strategies import ScratchTrainer
    from common.config import RunConfig

    cfg = RunConfig(
        backend="torch",
        strategy="scratch",
        devices=devices,
        model="lenet",
        batch_size=batch_size,
        lr=0.5,
        device_kind=device_kind,
        simulated=simulated,
        levers=Levers(**levers),
    ).validate()
    return ScratchTrainer(cfg, backend.initial_weights("lenet", 0))


def flat(weights: dict) -> np.ndarray:
    return np.concatenate([weights[k].ravel().astype(np.float64) for k in sorted(weights)])


def steps_with(backend, strategy, devices, n_steps=2, dtype="float32", **levers):
    start = backend.initial_weights("lenet", 0)
    probe = Probe(strategy, "lenet", devices, dtype=dtype, levers=Levers(**levers))
    return start, backend.train_steps(probe, start, image_batches(n_steps), 0.5)


def test_scratch_allreduce_op_leaves_the_sum_on_every_replica(backend):
    """What allreduce_seconds times is a real reduction: after one call every buffer holds the sum (3 x ones)."""
    trainer = scratch_trainer(backend, devices=3, batch_size=6)
    reduce = trainer.allreduce_op(10)
    buffers = reduce()
    assert len(buffers) == 3 and all(b.dtype.is_floating_point and b.numel() == 10 for b in buffers)
    assert all(np.array_equal(b.numpy(), np.full(10, 3.0, np.float32)) for b in buffers)


def test_channels_last_lays_the_model_and_batches_out_in_nhwc(backend):
    """--channels-last: the model's weights and the staged batches in torch.channels_last (NHWC) memory format.
    (That its step is the plain step's math: test_contract's lever tests.)"""
    import torch

    trainer = scratch_trainer(backend, channels_last=True)
    assert trainer.module.conv2.weight.is_contiguous(memory_format=torch.channels_last)
    assert not trainer.module.conv2.weight.is_contiguous()
    ((xs, _),) = trainer.stage(image_batches(1, size=8))
    assert all(x.is_contiguous(memory_format=torch.channels_last) for x in xs.value)


def test_compile_compiles_each_replicas_forward_not_the_module(backend):
    """--compile (scratch): each replica's forward is its torch.compile wrapper, the module itself stays eager. (That
    the compiled step is the eager step's math: test_contract's lever tests.)"""
    from torch._dynamo.eval_frame import OptimizedModule

    trainer = scratch_trainer(backend, devices=1, compile=True)
    assert isinstance(trainer.forwards[0], OptimizedModule) and not isinstance(
        trainer.module, OptimizedModule
    )


def test_the_recorded_layout_is_the_one_the_model_computes_in(backend):
    """Fashion-MNIST's batches reach torch with NHWC's strides (784, 1, 28, 1) (a one-channel batch is contiguous
    in both layouts), so cuDNN computed a run without --channels-last in NHWC while the record said NCHW. The
    record, the placed batch and the first convolution's output now agree, read by torch's own rule."""
    import torch

    from backends.torch.models import computed_layout
    from common.data import Dataset, train_batches
    from common.data.fashion_mnist import _images

    u8 = np.random.default_rng(0).integers(0, 256, (16, 28, 28), dtype=np.uint8)
    labels = np.zeros(16, np.int32)
    data = Dataset("fashion-mnist", "test", _images(u8), labels, _images(u8), labels)
    x, y = train_batches(data, 8, seed=0, epoch=0)[0]
    assert torch.from_numpy(x).stride() == (
        784,
        1,
        28,
        1,
    )  # as the data arrives: the bug's precondition
    for channels_last in (False, True):
        trainer = scratch_trainer(backend, channels_last=channels_last)
        recorded = backend.environment(trainer.cfg)["layout"]
        assert recorded == ("NHWC" if channels_last else "NCHW")
        (placed, *_), _ = trainer.place(x, y)
        first_conv = next(m for m in trainer.module.modules() if isinstance(m, torch.nn.Conv2d))
        outputs = []
        handle = first_conv.register_forward_hook(lambda m, i, out: outputs.append(out))
        with torch.no_grad():
            trainer.module(placed)
        handle.remove()
        assert computed_layout(placed) == computed_layout(outputs[0]) == recorded
        assert np.array_equal(placed.numpy(), x[:4])  # the same values, only the strides told


# ------------------------------------------------------------------ prefetch, foreach, cuDNN autotuning, compile modes


def test_put_and_stage_place_the_shards_without_waiting(backend):
    """put() (--prefetch) and stage() (--resident-data) lay a batch out as its step takes it: a tensor shard per
    replica, nothing to wait for on the CPU. (That such batches take the numpy batches' steps: test_contract.)"""
    import torch

    from backends.torch.parallel import OnDevice

    trainer = scratch_trainer(backend)
    ((x, y),) = image_batches(1)
    placed_x, placed_y = trainer.put(x, y)
    assert isinstance(placed_x, OnDevice) and placed_x.ready == {}  # nothing to wait for on the CPU
    assert [t.shape[0] for t in placed_x.value] == [4, 4]
    assert [str(t.dtype) for t in placed_y.value] == ["torch.int64"] * 2
    assert np.array_equal(np.concatenate([t.numpy() for t in placed_x.take()]), x)
    staged = trainer.stage(image_batches(2))
    assert len(staged) == 2 and all(isinstance(t, torch.Tensor) for t in staged[0][0].value)


def test_scratch_update_is_one_foreach_call_equal_to_the_per_tensor_update(backend):
    """torch._foreach_sub_ gives the per-parameter p.sub_(g, alpha=lr/B) of d2l's sgd to the last bit (float64)."""
    import torch

    from backends.torch.strategies import ScratchTrainer
    from common.config import RunConfig

    cfg = RunConfig(
        backend="torch", strategy="scratch", devices=2, model="lenet", batch_size=8, lr=0.5
    ).validate()
    trainer = ScratchTrainer(cfg, backend.initial_weights("lenet", 0), dtype="float64")
    trainer.reset()
    trainer.reduce_gradients(*[(np.asarray(x, np.float64), y) for x, y in image_batches(1)][0])
    expected = [
        [p.detach().clone().sub_(p.grad, alpha=cfg.lr / cfg.batch_size) for p in net.parameters()]
        for net in trainer.replicas
    ]
    trainer.update()
    for net, want in zip(trainer.replicas, expected):
        assert all(torch.equal(p, w) for p, w in zip(net.parameters(), want))


def test_cudnn_autotuning_is_on_for_gpu_runs_only_and_recorded():
    import torch

    from backends.torch.environment import configure_precision, precision_settings
    from common.config import RunConfig

    def settings(kind):
        cfg = RunConfig(
            backend="torch",
            strategy="ddp",
            devices=1,
            device_kind=kind,
            simulated=kind == "cpu",
            model="lenet",
            batch_size=8,
        ).validate()
        configure_precision(cfg)
        assert precision_settings(cfg)["cudnn_benchmark"] is torch.backends.cudnn.benchmark
        return precision_settings(cfg)

    try:
        assert settings("gpu")["cudnn_benchmark"] is True
    finally:
        assert settings("cpu")["cudnn_benchmark"] is False


def test_environment_changes_no_global_setting(backend):
    """environment() describes a run's precision without setting it: torch's switches stay as they were,
    whatever the run would set (TF32 and cuDNN autotuning on a GPU run, bf16 autocast on the CPU)."""
    import torch

    from common.config import RunConfig

    def switches():
        return (
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            torch.backends.cudnn.benchmark,
            torch.get_float32_matmul_precision(),
        )

    before = switches()
    for kind, precision in (("gpu", "tf32"), ("gpu", "fp32"), ("cpu", "bf16")):
        cfg = RunConfig(
            backend="torch",
            strategy="ddp",
            devices=1,
            device_kind=kind,
            simulated=kind == "cpu",
            model="lenet",
            batch_size=8,
            levers=Levers(precision=precision),
        ).validate()
        env = backend.environment(cfg)
        assert env["precision"]["tf32_matmul"] is (precision == "tf32")
        assert env["precision"]["cudnn_benchmark"] is (kind == "gpu")
        assert switches() == before, (kind, precision)


def test_compile_mode_reaches_torch_compile(backend, monkeypatch):
    import torch

    modes = []
    monkeypatch.setattr(torch, "compile", lambda module, **kw: modes.append(kw) or module)
    scratch_trainer(backend, devices=1, compile=True, compile_mode="max-autotune")
    scratch_trainer(backend, devices=1, compile=True)
    assert modes == [{"mode": "max-autotune"}, {}]


def test_environment_records_the_input_copies_and_the_update(backend):
    from common.config import RunConfig

    def env(**kw):
        values = dict(backend="torch", strategy="scratch", devices=2, model="lenet", batch_size=8)
        return backend.environment(RunConfig.from_dict({**values, **kw}).validate())

    assert (
        env()["input_copies"]
        == "2 batches ahead of their step: no copy (the CPU devices read the numpy batch's memory)"
    )
    assert env(resident_data=True)["input_copies"].startswith("none timed")
    assert env()["sgd_update"].startswith("torch._foreach_sub_")
    assert env(strategy="ddp")["sgd_update"] == "torch.optim.SGD(foreach=False)"
    compiled = env(strategy="ddp", compile=True, compile_mode="max-autotune")["compile"]
    assert compiled == (
        "torch.compile (TorchInductor, mode max-autotune) of the DistributedDataParallel-wrapped module"
    )


# ------------------------------------------------------------------ CUDA only (run where a GPU is present)


def cuda_devices() -> int:
    if NAME != "torch":
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


needs_cuda = pytest.mark.skipif(cuda_devices() == 0, reason="needs a CUDA GPU")
GPUS = min(2, cuda_devices())


def gpu_steps(backend, strategy, devices, dtype="float32", **levers):
    start = backend.initial_weights("lenet", 0)
    probe = Probe(
        strategy, "lenet", devices, device_kind="gpu", dtype=dtype, levers=Levers(**levers)
    )
    return backend.train_steps(probe, start, image_batches(2), 0.5)


def cpu_float64_steps(backend, devices):
    return steps_with(backend, "scratch", devices, dtype="float64")[1]


@needs_cuda
@pytest.mark.parametrize("name", ["scratch", "dp", "ddp"])
def test_cuda_strategies_take_the_float64_step_of_the_cpu(backend, name):
    """On the GPUs, in float64: scratch, nn.DataParallel and NCCL DDP take the CPU's step."""
    on_gpu = gpu_steps(backend, name, GPUS, dtype="float64")
    assert relative(on_gpu, cpu_float64_steps(backend, GPUS)) <= IDENTICAL


@needs_cuda
@pytest.mark.parametrize("name", ["scratch", "ddp"])
def test_cuda_prefetch_from_pinned_memory_takes_the_same_steps_bit_for_bit(backend, name):
    plain = gpu_steps(backend, name, GPUS, dtype="float64", prefetch=0)
    ahead = gpu_steps(backend, name, GPUS, dtype="float64", prefetch=2)
    assert all(np.array_equal(ahead[k], plain[k]) for k in plain)


@needs_cuda
def test_cuda_put_copies_from_pinned_memory_on_a_copy_stream(backend):
    import torch

    trainer = scratch_trainer(
        backend, devices=GPUS, batch_size=8, device_kind="gpu", simulated=False
    )
    ((x, y),) = image_batches(1)
    placed_x, _ = trainer.put(x, y)
    assert set(placed_x.ready) == set(trainer.devs)
    assert all(t.is_cuda for t in placed_x.take())
    torch.cuda.synchronize()
    assert np.array_equal(np.concatenate([t.cpu().numpy() for t in placed_x.value]), x)


@needs_cuda
def test_cuda_fed_steps_neither_synchronise_nor_allocate_pinned_memory(backend):
    """An epoch's work between its barriers, on one GPU: each batch put ahead of its step from the page-locked
    buffer pin() filled before the timer, then the steps. No call may make the host wait for the device (torch's
    sync debug mode raises on one), and no page-locked memory may be allocated (CUDA synchronises the device for
    it): the host then runs ahead of the device, as with resident batches."""
    import torch

    from common import trainer as trainerlib

    trainer = scratch_trainer(backend, devices=1, batch_size=8, device_kind="gpu", simulated=False)
    trainer.reset()
    batches = trainer.pin(image_batches(6))
    trainer.sync()
    stats = getattr(torch.cuda, "host_memory_stats", dict)
    allocations = stats().get("num_host_alloc")
    torch.cuda.set_sync_debug_mode("error")
    try:
        for x, y in trainerlib.feed(trainer, batches, trainer.cfg):
            trainer.step(x, y)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    trainer.sync()
    assert stats().get("num_host_alloc") == allocations


@needs_cuda
@pytest.mark.parametrize(
    "levers",
    [{}, {"channels_last": True}, {"compile": True}, {"precision": "tf32"}, {"precision": "bf16"}],
)
def test_cuda_float32_levers_stay_near_the_float64_step(backend, levers):
    """fp32 on the GPU (TF32 off, cuDNN's autotuned algorithms) stays within 10x the CPU's float32 distance
    from the float64 step, measured here (TF32 left on would be ~1000x); TF32 and bf16 stay within 10 units
    of their own rounding (11 and 8 significant bits) of the float64 update."""
    start = backend.initial_weights("lenet", 0)
    exact = cpu_float64_steps(backend, GPUS)
    cpu_fp32 = steps_with(backend, "scratch", GPUS)[1]
    got = gpu_steps(backend, "scratch", GPUS, **levers)
    unit = {"tf32": 2.0**-11, "bf16": 2.0**-8}.get(levers.get("precision"))
    if unit is None:
        assert max_abs_diff(got, exact) <= 10 * max_abs_diff(cpu_fp32, exact)
    else:
        update = flat(exact) - flat(start)
        assert np.linalg.norm(flat(got) - flat(start) - update) / np.linalg.norm(update) < 10 * unit


@needs_cuda
def test_cuda_ddp_sync_batchnorm_is_batchnorm_on_one_device(backend):
    from common.weights import he_scaled

    start = he_scaled(backend.initial_weights("resnet18", 0), "resnet18")
    batches = image_batches(1, size=8)
    one = backend.train_steps(Probe("scratch", "resnet18", 1, dtype="float64"), start, batches, 0.1)
    sync = backend.train_steps(
        Probe("ddp", "resnet18", GPUS, bn="sync", device_kind="gpu", dtype="float64"),
        start,
        batches,
        0.1,
    )
    assert relative(sync, one) <= IDENTICAL


@needs_cuda
def test_cuda_worker_trains_with_prefetch_and_records_it(tmp_path):
    rc, r = run_worker(
        tmp_path,
        strategy="ddp",
        devices=GPUS,
        device_kind="gpu",
        simulated=False,
        timed_steps=3,
        epochs=1,
    )
    assert rc == 0 and r["status"] == "ok", r["error"]
    env = r["environment"]
    assert env["input_copies"].startswith("2 batches ahead of their step: pinned host memory")
    assert env["precision"]["cudnn_benchmark"]


# ------------------------------------------------------------------ the model's FLOPs; two hosts under Slurm


@pytest.mark.parametrize(
    "model, side", [("lenet", 28), ("resnet18", 28), ("resnet50", 64), ("resnet50", 224)]
)
def test_the_model_flop_count_is_torchs_own_count_of_the_forward_pass(model, side):
    """harness/reporting/flops.py counts from the architecture; torch's FlopCounterMode counts the convolutions and
    matrix products the forward pass runs (biases, BatchNorm and pooling left out by both)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from backends.torch.models import build
    from common import architectures
    from harness.reporting import flops

    net = build(model).eval()
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        net(torch.zeros(1, architectures.in_channels(model), side, side))
    assert counter.get_total_flops() == flops.forward_flops(model, side)


def test_two_hosts_under_slurm_meet_at_the_first_host_of_the_node_list(tmp_path):
    """The README's Slurm recipe across two hosts (network namespaces that know each other by name): no
    --node-rank or --coordinator, srun's variables give the node count, each host's rank and the coordinator
    (the first host of SLURM_NODELIST, port 29500). Each host's own name resolves to 127.0.1.1 there."""
    with two_hosts("slurm") as hosts:
        outs = [tmp_path / f"host-{r}" for r in range(2)]
        logs = [tmp_path / f"host-{r}.log" for r in range(2)]
        slurm = {"SLURM_NTASKS": "2", "SLURM_NODELIST": ",".join(h.namespace for h in hosts)}
        procs = [
            start_harness(
                host,
                small_run("torch", "ddp", out, "--gpus", "1", "--join-timeout", "120"),
                log,
                env={**slurm, "SLURM_PROCID": str(rank)},
            )
            for rank, (host, out, log) in enumerate(zip(hosts, outs, logs))
        ]
        codes = wait_all(procs, logs, 420)
    assert codes == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)
    for rank, (host, out) in enumerate(zip(hosts, outs)):
        config = run_row(out)["config"]
        assert (
            config["nodes"],
            config["node_rank"],
            config["coordinator"],
            config["local_addr"],
        ) == (2, rank, f"{hosts[0].namespace}:29500", host.address)
    assert (outs[0] / "weights.npz").exists() and not (
        outs[1] / "weights.npz"
    ).exists()  # node 0's rank 0 saves


@needs_cuda
def test_cuda_the_energy_counter_agrees_with_power_samples_integrated_over_the_same_seconds():
    """About 8 s of matrix products on GPU 0: the joules NVML's energy counter gained (common/energy.py) against its
    power readings taken 10 times a second and integrated over the same interval; within 5%, as docs/energy.md
    asks (a power reading is a short average, so the two need not agree to the joule)."""
    import threading
    import time

    import pynvml
    import torch

    from common import energy

    meter = energy.open_meter("gpu", 1)
    assert isinstance(meter, energy.Meter), meter
    handle = pynvml.nvmlDeviceGetHandleByIndex(int(energy.visible_gpus(os.environ, 1)[0]))
    samples, done = [], threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.perf_counter(), pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3))
            time.sleep(0.1)

    a = torch.randn(8192, 8192, device="cuda")
    clock = energy.EnergyClock(meter)
    sampler = threading.Thread(target=sample)
    torch.cuda.synchronize()
    clock.start()
    start = time.perf_counter()
    sampler.start()
    while time.perf_counter() - start < 8.0:
        for _ in range(20):
            a = a @ a / a.norm()
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    interval = clock.stop(seconds)
    done.set()
    sampler.join()
    t, watts = zip(*samples)
    pairs = zip(t, t[1:], watts, watts[1:])
    integrated = sum((t1 - t0) * (w0 + w1) / 2 for t0, t1, w0, w1 in pairs)
    assert interval.joules == pytest.approx(integrated, rel=0.05)
