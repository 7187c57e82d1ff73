"""PyTorch-only behaviour: DDP failure handling, dp refusal, the worker end to end, the levers, and the
CPU synchronised BatchNorm. Identity of math is proven in float64 (numerics.IDENTICAL); a lever that only
exists in float32 is judged against float32's own distance from float64, measured in the same test."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.backends.conftest import NAME, run_backend_worker
from tests.backends.numerics import IDENTICAL, float32_tolerance, max_abs_diff, relative

pytestmark = pytest.mark.skipif(NAME != "torch", reason="torch backend only")


def rank_processes_of(pid: int) -> list[int]:
    """Live children started by multiprocessing spawn (the ranks; not its resource tracker)."""
    kids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if b"spawn_main" in f.read():
                    kids.append(int(entry))
    return kids


def fail_on_rank_1(cfg, rank, payload):
    """Rank 1 raises; rank 0 waits in a collective that will never complete."""
    import torch.distributed as dist
    if rank == 1:
        raise ValueError("planted failure in rank 1")
    dist.barrier()
    return "unreachable"


def test_a_failing_rank_fails_the_run_with_its_error_and_leaves_no_process():
    from backends.torch.strategies import launch_ddp
    from common.config import RunConfig
    cfg = RunConfig(backend="torch", strategy="ddp", devices=2, batch_size=8, timeout=120).validate()
    assert rank_processes_of(os.getpid()) == []
    with pytest.raises(RuntimeError) as info:
        launch_ddp(cfg, fail_on_rank_1)
    assert "DDP rank 1 failed" in str(info.value)
    assert "planted failure in rank 1" in str(info.value)
    assert rank_processes_of(os.getpid()) == []


def test_dataparallel_is_refused_without_cuda():
    import torch
    from backends.torch import initial_weights, train_steps
    from common.loop import Unsupported
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(Unsupported, match="needs CUDA"):
        train_steps("dp", "lenet", 1, initial_weights("lenet", 0), [(np.zeros((2, 1, 28, 28), np.float32),
                                                                    np.zeros(2, np.int32))], 0.1)


def run_worker(tmp_path, **overrides) -> tuple[int, dict]:
    return run_backend_worker(tmp_path, **{"strategy": "ddp", **overrides})


@pytest.mark.parametrize("name", ["scratch", "ddp"])
def test_worker_trains_and_writes_a_complete_result(tmp_path, name):
    rc, r = run_worker(tmp_path, strategy=name)
    assert rc == 0 and r["status"] == "ok", r["error"]
    assert r["schema_version"] == 1 and r["params"] == 129_068
    assert [e["epoch"] for e in r["epochs"]] == [1, 2]
    assert all(e["steps"] == 4 and e["images"] == 64 for e in r["epochs"])
    assert r["epochs"][1]["train_loss"] < r["epochs"][0]["train_loss"]
    assert all(0.0 <= e["test_acc"] <= 1.0 for e in r["epochs"])
    assert r["environment"]["framework"] == "torch" and len(r["environment"]["devices"]) == 2
    assert r["environment"]["processes"] == (2 if name == "ddp" else 1)
    assert len(r["weights_hash"]) == 64 and len(r["data_hash"]) == 64
    assert r["compile_s"] > 0
    assert r["step_time"]["steps"] == 20                      # RunConfig's default --timed-steps
    assert r["allreduce"]["values"] == r["params"] == 129_068  # a buffer as large as LeNet's gradients
    assert r["allreduce"]["bytes"] == 4 * 129_068 and r["allreduce"]["repeats"] == 10
    assert r["environment"]["precision"]["tf32_matmul"] is False and r["environment"]["compile"] is None


def test_worker_reports_divergence(tmp_path):
    rc, r = run_worker(tmp_path, strategy="scratch", lr=1e30, epochs=1)
    assert rc == 1 and r["status"] == "diverged"
    assert "training loss became" in r["error"]


# ------------------------------------------------------------------ levers and the loop's trainer methods

def image_batches(n_steps=1, size=8):
    rng = np.random.default_rng(0)
    return [(rng.random((size, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, size).astype(np.int32))
            for _ in range(n_steps)]


def scratch_trainer(devices=2, batch_size=8, **levers):
    from backends.torch import initial_weights
    from backends.torch.strategies import ScratchTrainer
    from common.config import RunConfig
    cfg = RunConfig(backend="torch", strategy="scratch", devices=devices, model="lenet", batch_size=batch_size,
                    lr=0.5, **levers).validate()
    return ScratchTrainer(cfg, initial_weights("lenet", 0))


def flat(weights: dict) -> np.ndarray:
    return np.concatenate([weights[k].ravel().astype(np.float64) for k in sorted(weights)])


def steps_with(strategy, devices, n_steps=2, dtype="float32", **levers):
    from backends.torch import initial_weights, train_steps
    start = initial_weights("lenet", 0)
    return start, train_steps(strategy, "lenet", devices, start, image_batches(n_steps), 0.5, dtype=dtype, **levers)


def test_allreduce_seconds_gives_one_positive_time_per_repeat():
    seconds = scratch_trainer().allreduce_seconds(1000, 4)
    assert len(seconds) == 4 and all(isinstance(s, float) and s > 0 for s in seconds)


def test_scratch_allreduce_op_leaves_the_sum_on_every_replica():
    """What allreduce_seconds times is a real reduction: after one call every buffer holds the sum (3 x ones)."""
    trainer = scratch_trainer(devices=3, batch_size=6)
    reduce = trainer.allreduce_op(10)
    buffers = reduce()
    assert len(buffers) == 3 and all(b.dtype.is_floating_point and b.numel() == 10 for b in buffers)
    assert all(np.array_equal(b.numpy(), np.full(10, 3.0, np.float32)) for b in buffers)


def test_a_staged_step_equals_a_numpy_step():
    """stage() places the shards once, as tensors; the steps on them are the numpy steps (float64)."""
    import torch
    staged = scratch_trainer().stage(image_batches(2))
    assert len(staged) == 2 and all(isinstance(t, torch.Tensor) for t in staged[0][0].value)
    start, plain = steps_with("scratch", 2, dtype="float64")
    _, resident = steps_with("scratch", 2, dtype="float64", resident_data=True)
    assert max_abs_diff(plain, start) > 1e-3          # the steps really moved the weights
    assert relative(resident, plain) <= IDENTICAL


def test_ddp_resident_data_takes_the_same_steps():
    start, plain = steps_with("ddp", 2, dtype="float64")
    _, staged = steps_with("ddp", 2, dtype="float64", resident_data=True)
    assert max_abs_diff(plain, start) > 1e-3
    assert relative(staged, plain) <= IDENTICAL


def test_channels_last_takes_the_same_step_in_nhwc():
    """NHWC exists in float32 only: its steps are as close to the float64 steps as the plain float32 ones."""
    import torch
    trainer = scratch_trainer(channels_last=True)
    assert trainer.module.conv2.weight.is_contiguous(memory_format=torch.channels_last)
    assert not trainer.module.conv2.weight.is_contiguous()
    (xs, _), = trainer.stage(image_batches(1, size=8))
    assert all(x.is_contiguous(memory_format=torch.channels_last) for x in xs.value)
    start, plain = steps_with("scratch", 2)
    _, exact = steps_with("scratch", 2, dtype="float64")
    _, nhwc = steps_with("scratch", 2, channels_last=True)
    assert max_abs_diff(plain, start) > 1e-3
    assert max_abs_diff(nhwc, exact) <= float32_tolerance((plain, exact))


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # inside inductor
def test_compiled_step_equals_the_eager_step():
    """torch.compile exists in float32 only: its step is as close to the float64 step as the eager one."""
    from torch._dynamo.eval_frame import OptimizedModule
    trainer = scratch_trainer(devices=1, compile=True)
    assert isinstance(trainer.forwards[0], OptimizedModule) and not isinstance(trainer.module, OptimizedModule)
    start, eager = steps_with("scratch", 1, n_steps=1)
    _, exact = steps_with("scratch", 1, n_steps=1, dtype="float64")
    _, compiled = steps_with("scratch", 1, n_steps=1, compile=True)
    assert max_abs_diff(eager, start) > 1e-3
    assert max_abs_diff(compiled, exact) <= float32_tolerance((eager, exact))


BFLOAT16_UNIT_ROUNDOFF = 2.0 ** -8   # bfloat16 keeps 8 significant bits


def test_bf16_step_is_close_to_the_fp32_step_but_not_the_same():
    """Autocast computes forward and loss in bfloat16; weights, gradients and SGD stay float32. Its update
    is off the float64 update by far more than float32 rounding (bfloat16 really ran), yet by only a few
    units of bfloat16's rounding (it is the same step, rounded coarser)."""
    start, fp32 = steps_with("scratch", 2)
    _, exact = steps_with("scratch", 2, dtype="float64")
    _, bf16 = steps_with("scratch", 2, precision="bf16")
    assert all(v.dtype == np.float32 for v in bf16.values())
    assert max_abs_diff(bf16, exact) > float32_tolerance((fp32, exact))
    update, bf16_update = flat(exact) - flat(start), flat(bf16) - flat(start)
    assert np.linalg.norm(bf16_update - update) / np.linalg.norm(update) < 10 * BFLOAT16_UNIT_ROUNDOFF


def test_float64_refuses_the_float32_levers_and_unknown_dtypes():
    from common.loop import Unsupported
    for lever in ({"precision": "bf16"}, {"compile": True}, {"channels_last": True}):
        with pytest.raises(Unsupported, match="dtype float64 runs the plain eager step only"):
            steps_with("scratch", 1, dtype="float64", **lever)
    with pytest.raises(ValueError, match="unknown dtype 'float16'"):
        steps_with("scratch", 1, dtype="float16")


def test_tf32_is_refused_on_the_cpu():
    from common.loop import Unsupported
    with pytest.raises(Unsupported, match="TF32 is a mode of NVIDIA tensor cores; there is none on the CPU"):
        steps_with("scratch", 1, precision="tf32")


def test_environment_records_the_levers():
    from backends.torch import environment
    from common.config import RunConfig
    cfg = RunConfig(backend="torch", strategy="ddp", devices=2, model="lenet", batch_size=8, precision="bf16",
                    compile=True, channels_last=True, resident_data=True).validate()
    env = environment(cfg)
    assert env["precision"]["autocast"] == {"device_type": "cpu", "dtype": "bfloat16"}
    assert env["precision"]["tf32_matmul"] is False and env["precision"]["tf32_cudnn"] is False
    assert env["compile"]["target"] == "the DistributedDataParallel-wrapped module"
    assert env["memory_format"] == "channels_last" and env["resident_data"] is True


def test_worker_runs_ddp_with_every_lever_that_runs_on_the_cpu(tmp_path):
    rc, r = run_worker(tmp_path, strategy="ddp", timed_steps=3, precision="bf16", channels_last=True,
                       resident_data=True, epochs=1)
    assert rc == 0 and r["status"] == "ok", r["error"]
    assert r["step_time"]["steps"] == 3
    assert r["allreduce"]["values"] == 129_068 and r["allreduce"]["repeats"] == 10
    assert r["environment"]["precision"]["mode"] == "bf16" and r["environment"]["memory_format"] == "channels_last"
    assert np.isfinite(r["epochs"][0]["train_loss"])


# ------------------------------------------------------------------ synchronised BatchNorm over gloo

def test_ddp_sync_batchnorm_on_two_ranks_is_batchnorm_on_one_device():
    """--bn sync: CPUSyncBatchNorm's all-reduces over 2 gloo ranks give nn.BatchNorm2d's step on one device
    holding the whole batch, parameters and running statistics alike (ResNet-18, batch 8, float64);
    per-rank statistics (--bn local) give another step."""
    from backends.torch import initial_weights, train_steps
    from common.weights import he_scaled
    start = he_scaled(initial_weights("resnet18", 0), "resnet18")
    batches = image_batches(1, size=8)
    one = train_steps("scratch", "resnet18", 1, start, batches, 0.1, dtype="float64")
    sync = train_steps("ddp", "resnet18", 2, start, batches, 0.1, bn="sync", dtype="float64")
    local = train_steps("ddp", "resnet18", 2, start, batches, 0.1, bn="local", dtype="float64")
    assert sync.keys() == start.keys() and {v.dtype for v in sync.values()} == {np.dtype(np.float64)}
    assert max_abs_diff(one, start) > 1e-3
    assert relative(sync, one) <= IDENTICAL
    assert relative(local, one) > 1e6 * IDENTICAL
