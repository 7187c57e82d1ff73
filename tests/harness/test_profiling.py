"""Where a step's time goes (common/profiling.py): a Chrome trace read into the same categories for every framework,
on hand-made traces whose answer is known to the microsecond, and on the GPU traces committed with the reports (no
framework; the contract suite reads real ones as they are written)."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from common import manifest, profiling
from common.profiling import Recording, TraceError
from tests.harness.helpers import ROOT


def op(name: str, start: float, end: float, tid: int = 1, **extra) -> dict:
    return {"ph": "X", "name": name, "ts": start, "dur": end - start, "pid": 1, "tid": tid, **extra}


def write(tmp_path, events, name="t.json") -> str:
    path = tmp_path / name
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path


def seconds_of(tmp_path, events, framework="torch", wall_us=200.0, steps=1) -> dict:
    path = write(tmp_path, events)
    return profiling.breakdown(path, profiling.framework_ops(framework), wall_us / 1e6, steps)[
        "seconds"
    ]


def micro(seconds: dict) -> dict:
    """The non-zero categories in microseconds, rounded: what the hand-made traces are checked against."""
    return {k: round(v * 1e6, 3) for k, v in seconds.items() if v}


def test_an_op_takes_the_category_of_its_outermost_categorised_op_and_gaps_are_untraced(tmp_path):
    """conv2d holds mkldnn_convolution (one convolution, 100 us); Optimizer.step holds the add_ it runs (an
    optimizer's 50 us, not element-wise); the 50 us with nothing traced are untraced: 200 us in all."""
    events = [
        op("ProfilerStep#1", 0, 150),  # matches nothing: its children decide
        op("aten::conv2d", 0, 100),
        op("aten::mkldnn_convolution", 10, 90),
        op("Optimizer.step#SGD.step", 100, 150),
        op("aten::add_", 110, 140),
    ]
    assert micro(seconds_of(tmp_path, events)) == {
        "conv_matmul": 100,
        "optimizer": 50,
        "untraced": 50,
    }


def test_an_instant_counts_once_for_the_category_first_in_the_table(tmp_path):
    """Communication on another thread during a convolution is hidden by it: only its exposed 20 us count; an
    unknown op's time is "other ops" only where nothing else runs."""
    events = [
        op("aten::conv2d", 0, 100, tid=1),
        op("gloo:all_reduce", 80, 120, tid=2),
        op("aten::empty", 0, 150, tid=3),
    ]
    assert micro(seconds_of(tmp_path, events)) == {
        "conv_matmul": 100,
        "communication": 20,
        "other_ops": 30,
        "untraced": 50,
    }


def test_begin_and_end_pairs_count_as_complete_events_and_gzip_is_read(tmp_path):
    """MXNet writes `B`/`E` pairs; a gzipped trace reads as a plain one. Per step: two steps of 100 us."""
    events = [
        {"ph": "B", "name": "ImperativeBulk", "ts": 0, "pid": 0, "tid": 7},
        {"ph": "E", "name": "ImperativeBulk", "ts": 60, "pid": 0, "tid": 7},
        {"ph": "B", "name": "multi_sgd_update", "ts": 60, "pid": 0, "tid": 7},
        {"ph": "E", "name": "multi_sgd_update", "ts": 80, "pid": 0, "tid": 7},
        {"ph": "C", "name": "Memory", "ts": 10, "pid": 0, "args": {"x": 1}},
    ]
    path = write(tmp_path, events, "t.json.gz")
    result = profiling.breakdown(path, profiling.framework_ops("mxnet"), 200e-6, 2)
    assert micro(result["seconds"]) == {"fused": 30, "optimizer": 10, "untraced": 60}
    assert result["step_s"] == pytest.approx(100e-6) and result["trace_span_s"] == pytest.approx(
        80e-6
    )


def test_on_a_gpu_only_the_devices_events_count(tmp_path):
    """A trace with CUDA kernels: the host's ops are left out, and the device's idle time is untraced."""
    events = [
        op("aten::conv2d", 0, 200, tid=1, cat="cpu_op"),
        op("sm90_xmma_fprop_implicit_gemm", 20, 80, tid=9, cat="kernel"),
        op("Memcpy HtoD (Pageable -> Device)", 0, 10, tid=10, cat="gpu_memcpy"),
    ]
    path = write(tmp_path, events)
    result = profiling.breakdown(path, profiling.framework_ops("torch"), 200e-6, 1)
    assert result["device"] and micro(result["seconds"]) == {
        "conv_matmul": 60,
        "copies": 10,
        "untraced": 130,
    }


def kernel(category: str, start: float, end: float, framework: str) -> dict:
    """A kernel of `category` as torch's profiler writes it (category "kernel", on its stream) or as XLA's (on a
    stream of a process named /device:GPU:0, no category), named as an H200 ran them."""
    name = KERNELS[framework][category]
    if framework == "torch":
        return op(name, start, end, tid=7, pid=0, cat="kernel")
    return op(name, start, end, tid=14, pid=1)


KERNELS = {
    "torch": {
        "bn_elementwise": "void at::native::batch_norm_collect_statistics_kernel<bf16>",
        "conv_matmul": "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc",
        "copies": "void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16>",
    },
    "jax": {
        "bn_elementwise": "input_reduce_fusion_57",
        "conv_matmul": "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc",
        "copies": "memcpy32_post",
    },
}
XLA_DEVICE = {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}}


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_kernels_of_one_stream_that_overlap_are_each_counted_whole_and_their_overlap_once(
    tmp_path, framework
):
    """A stream runs its kernels one after another, but the tracer's timestamps overlap by fractions of a
    microsecond: a kernel that starts 0.2 us before the previous one ends is not inside it. Each keeps its own
    category, whole; the 0.2 us both cover counts once, to the category first in the table. Of a 200 us step,
    the kernels' 120.2 us less two such overlaps: a union of 119.8 us."""
    events = [
        XLA_DEVICE,
        kernel("bn_elementwise", 0, 50, framework),
        kernel(
            "conv_matmul", 49.8, 99.8, framework
        ),  # first in the table: the shared 0.2 us is its
        kernel("conv_matmul", 120, 130, framework),
        kernel("copies", 129.8, 140, framework),
    ]
    seconds = micro(seconds_of(tmp_path, events, framework))
    assert seconds == {
        "conv_matmul": 60,
        "bn_elementwise": 49.8,
        "copies": 10,  # not clipped to the convolution's end at 130
        "untraced": 80.2,
    }
    assert sum(v for k, v in seconds.items() if k != "untraced") == pytest.approx(119.8)


def test_a_host_threads_ops_still_nest_in_their_parent():
    """On a host thread an op inside another is its child: clipped to its parent's end, in its category."""
    spans = [
        profiling.Span((1, 1), 0, 100, "Optimizer.step#SGD.step"),
        profiling.Span((1, 1), 90, 120, "aten::add_"),
    ]
    assert profiling.lane_segments(spans, profiling.framework_ops("torch")) == [
        (0, 90, "optimizer"),
        (90, 100, "optimizer"),
    ]


def test_a_gpus_idle_time_is_the_timed_steps_the_kernels_leave(tmp_path):
    """The profiler slows the host that launches the kernels, not the kernels: on a GPU the report counts the
    kernels as traced and the idle time in the timed step; on a CPU it keeps the profiled step's breakdown."""
    gpu = {"device": True, "seconds": {"conv_matmul": 60e-6, "copies": 10e-6, "untraced": 130e-6}}
    assert micro(profiling.step_seconds(gpu, 100e-6)) == {
        "conv_matmul": 60,
        "copies": 10,
        "untraced": 30,
    }
    # kernels longer than the timed step (a noisy step): no idle time, never a negative one
    assert micro(profiling.step_seconds(gpu, 50e-6)) == {"conv_matmul": 60, "copies": 10}
    cpu = {**gpu, "device": False}
    assert profiling.step_seconds(cpu, 100e-6) == cpu["seconds"]
    # without a timed step (a run that has none), the profiled step's
    assert profiling.step_seconds(gpu, None) == gpu["seconds"]


@pytest.mark.parametrize(
    "framework, name, category",
    [
        ("torch", "autograd::engine::evaluate_function: ConvolutionBackward0", "conv_matmul"),
        ("torch", "aten::native_batch_norm", "bn_elementwise"),
        ("torch", "aten::_foreach_sub_", "optimizer"),
        ("torch", "aten::copy_", "copies"),
        ("torch", "aten::empty", None),
        ("jax", "ynn_fusion.12", "conv_matmul"),
        ("jax", "convolution-base-dilated.1", "conv_matmul"),
        ("jax", "end: all-reduce", "communication"),
        ("jax", "broadcast_add_fusion.3", "bn_elementwise"),
        ("jax", "transpose_copy_fusion.2", "copies"),
        ("jax", "ThunkExecutor::Execute", None),
        ("jax", "Wait for donation holds", None),
        # CUDA kernels as an H200 ran them (torch 2.11 with CUDA 13, jax 0.11)
        (
            "torch",
            "sm90_xmma_wgrad_indexed_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc",
            "conv_matmul",
        ),
        (
            "torch",
            "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32>",
            "conv_matmul",
        ),
        ("torch", "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT", "conv_matmul"),
        ("torch", "void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16>", "copies"),
        (
            "torch",
            "void at::native::batch_norm_backward_kernel<c10::BFloat16, float>",
            "bn_elementwise",
        ),
        ("torch", "Memcpy HtoD (Pinned -> Device)", "copies"),
        (
            "torch",
            "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::BFloat16>>",
            "bn_elementwise",
        ),
        (
            "torch",
            "void at::native::multi_tensor_apply_kernel<at::native::TensorListMetadata<3>>",
            "optimizer",
        ),
        ("jax", "nvjet_sm90_tst_128x128_64x6_1x2_h_bz_splitK_NTT", "conv_matmul"),
        ("jax", "input_reduce_select_fusion_9", "bn_elementwise"),
        ("jax", "MemcpyH2D", "copies"),
        ("mxnet", "ImperativeBulk", "fused"),
        ("mxnet", "ElementwiseSum", "communication"),
        ("mxnet", "multi_sgd_update", "optimizer"),
        ("mxnet", "CopyCPU2CPU", "copies"),
        ("mxnet", "DeleteVariable", None),
    ],
)
def test_each_frameworks_op_names_map_to_the_shared_categories(framework, name, category):
    """Names as the frameworks' profilers write them (torch 2.x, jax 0.10 on the CPU, MXNet 1.9, and CUDA's)."""
    assert profiling.category(name, profiling.framework_ops(framework)) == category


@pytest.mark.parametrize("backend", manifest.known())
def test_a_backends_op_names_are_regexes_of_the_categories_a_name_can_take(backend):
    """backend.toml's [profile] ops: each regex compiles and names a category of the breakdown, not "other ops" or
    "untraced", which are where no name matches. Keras's traces are torch's or jax's; every other backend's are its
    own framework's."""
    ops = profiling.framework_ops(backend)
    assert bool(ops) == (backend != "keras"), backend
    for category, regex in ops:
        assert category in set(profiling.CATEGORIES) - {"other_ops", "untraced"}, (
            backend,
            category,
        )
        re.compile(regex)


@pytest.mark.parametrize(
    "content, says",
    [
        ("{not json", "not a readable Chrome trace"),
        ('{"traceEvents": 3}', "no traceEvents list"),
        ('{"traceEvents": [{"ph": "X", "name": "x", "ts": "soon", "dur": 1}]}', "no timed events"),
        ("[]", "no timed events"),
        # numbers JSON has not (Python reads them): a damaged trace, never a NaN or infinite breakdown
        ('[{"ph": "X", "name": "x", "ts": NaN, "dur": 1}]', "not a finite number"),
        ('[{"ph": "X", "name": "x", "ts": 0, "dur": Infinity}]', "not a finite number"),
        ('[{"ph": "X", "name": "x", "ts": 1e308, "dur": 1e308}]', "would not be finite numbers"),
    ],
)
def test_a_trace_that_cannot_be_read_is_one_line(tmp_path, content, says):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(TraceError, match=says):
        profiling.breakdown(path, profiling.framework_ops("torch"), 1.0, 1)


def test_a_run_without_a_readable_trace_says_why_instead_of_failing(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    unreadable = profiling.summary(Recording("torch", tmp_path / "bad.json"), tmp_path, 2.0, 2)
    assert unreadable["trace"] == "bad.json" and unreadable["step_s"] == 1.0
    assert unreadable["error"].startswith("bad.json: not a readable Chrome trace")
    missing = profiling.summary(Recording("torch"), tmp_path, 2.0, 2)
    assert missing["trace"] is None and missing["error"] == "the profiler wrote no trace"


def test_a_trace_that_does_not_span_its_steps_is_named(tmp_path):
    path = write(tmp_path, [op("aten::conv2d", 0, 100)])
    covered = profiling.breakdown(path, profiling.framework_ops("torch"), 110e-6, 1)
    short = profiling.breakdown(path, profiling.framework_ops("torch"), 500e-6, 1)
    assert profiling.coverage_problem(covered) is None
    assert profiling.coverage_problem(short) == (
        "the trace spans 20% of the profiled steps' wall time (expected 80%-125%)"
    )


# ------------------------------------------------------------------------ the committed GPU traces


def committed_gpu_traces() -> list[tuple[str, str]]:
    """(report, trace) of every committed run and idiom whose profile is a device's: the traces a GPU wrote."""
    found = []
    for path in sorted(ROOT.glob("reports/*/results.json")):
        doc = json.loads(path.read_text())
        records = doc["runs"] + ((doc.get("parity") or {}).get("idioms") or [])
        for record in records:
            profile = record.get("profile") or {}
            if profile.get("device") and profile.get("trace"):
                found.append((path.parent.name, profile["trace"]))
    return found


GPU_TRACES = committed_gpu_traces()
GPU_TRACE_IDS = [f"{report}/{trace.split('/')[1]}" for report, trace in GPU_TRACES]


@pytest.fixture(scope="module")
def device_events():
    """Each committed GPU trace's device events and process names, read once for the module's tests (the host's
    events, most of a trace, are not attributed on a GPU)."""
    read: dict[str, list[dict]] = {}

    def events_of(report: str, trace: str) -> list[dict]:
        path = ROOT / "reports" / report / trace
        if path not in read:
            events = profiling.read_events(path)
            gpus = profiling.device_processes(events)
            read[path] = [
                e
                for e in events
                if e.get("ph") == "M"
                or e.get("cat") in profiling.DEVICE_CATEGORIES
                or e.get("pid") in gpus
            ]
        return read[path]

    return events_of


def stored_profile(report: str, trace: str) -> dict:
    doc = json.loads((ROOT / "reports" / report / "results.json").read_text())
    records = doc["runs"] + ((doc.get("parity") or {}).get("idioms") or [])
    return next(r["profile"] for r in records if (r.get("profile") or {}).get("trace") == trace)


def union_us(events: list[dict]) -> float:
    """The time any device event covers, counted once: the intervals sorted and merged."""
    intervals = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X")
    total, end = 0.0, float("-inf")
    for start, stop in intervals:
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def test_the_committed_reports_hold_gpu_traces():
    assert len(GPU_TRACES) >= 20  # the H200 runs of 2026-11-26, jax's and torch's


@pytest.mark.parametrize("report, trace", GPU_TRACES, ids=GPU_TRACE_IDS)
def test_a_gpu_traces_breakdown_accounts_for_the_union_of_its_kernels(report, trace, device_events):
    """Every instant some kernel or copy runs is in the breakdown, once: jax's ResNet-18 streams, whose kernels
    overlap their predecessor's timestamps by fractions of a microsecond, read 3.10 ms of kernels a step where
    the trace holds 3.73 while each overlapping kernel was clipped to its predecessor's end."""
    events, profile = device_events(report, trace), stored_profile(report, trace)
    steps = profile["steps"]
    got = profiling.events_breakdown(
        events,
        trace,
        profiling.framework_ops(profile["framework"]),
        profile["step_s"] * steps,
        steps,
    )
    kernels_us = profiling.kernel_seconds(got) * steps * 1e6
    assert kernels_us == pytest.approx(union_us(events), rel=0.01)


@pytest.mark.parametrize("report, trace", GPU_TRACES, ids=GPU_TRACE_IDS)
def test_a_committed_gpu_breakdown_is_the_one_its_trace_gives(report, trace, device_events):
    """The figures a committed report shows are its traces' by the rules of this version (`harness report DIR
    --reread-traces` after a rule changes)."""
    profile = stored_profile(report, trace)
    steps = profile["steps"]
    got = profiling.events_breakdown(
        device_events(report, trace),
        trace,
        profiling.framework_ops(profile["framework"]),
        profile["step_s"] * steps,
        steps,
    )
    assert got["seconds"] == pytest.approx(profile["seconds"], rel=1e-9, abs=1e-12)


def test_a_gpu_traces_launches_are_counted_per_step_from_the_hosts_cuda_calls(tmp_path):
    """Graphs replayed and kernels launched one by one, by the CUDA runtime's and driver's names as torch's and
    XLA's tracers write them, per profiled step; a CPU trace has none to count."""
    events = [
        op("cudaGraphLaunch", 0, 5, tid=1, cat="cuda_runtime"),
        op("cuGraphLaunch (CudaGraph:251)", 10, 15, tid=1),
        op("cudaLaunchKernel", 20, 22, tid=1, cat="cuda_runtime"),
        op("cuLaunchKernelEx", 30, 32, tid=1),
        op("cudaGraphInstantiate", 40, 60, tid=1, cat="cuda_runtime"),  # a capture, not a launch
        op("sm90_xmma_fprop_implicit_gemm", 20, 80, tid=9, cat="kernel"),
    ]
    on_gpu = profiling.breakdown(
        write(tmp_path, events), profiling.framework_ops("torch"), 200e-6, 2
    )
    assert on_gpu["launches"] == {"graphs": 1.0, "kernels": 1.0}
    on_cpu = profiling.breakdown(
        write(tmp_path, events[:4]), profiling.framework_ops("torch"), 200e-6, 2
    )
    assert "launches" not in on_cpu


@pytest.mark.parametrize(
    "report, trace, graphs, kernels",
    [
        # torch with --compile-mode reduce-overhead: the forward's and the backward's graphs, then the loss, the
        # metrics and the foreach update launched one by one
        (
            "20261126-235148-torch",
            "traces/torch-scratch-bf16-compile-reduce-overhead-channels_last-resident_data--x1/rank0.trace.json.gz",
            2,
            16,
        ),
        # torch eager: every kernel from the host
        ("20261126-102658-jax-torch", "traces/torch-scratch-bf16--x1/rank0.trace.json.gz", 0, 466),
    ],
)
def test_a_committed_gpu_runs_launches_say_whether_it_replayed_cuda_graphs(
    report, trace, graphs, kernels
):
    profile = stored_profile(report, trace)
    counted = profiling.launches(
        profiling.read_events(ROOT / "reports" / report / trace), profile["steps"]
    )
    assert profile["launches"] == counted == {"graphs": graphs, "kernels": kernels}
