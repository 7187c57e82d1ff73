"""Report numbers and the rule that a report is complete or absent, and never overwritten."""

from __future__ import annotations

import gzip
import json
import random
import shutil
import socket
import tomllib
from pathlib import Path

import pytest

from common import results, sysinfo
from common.config import RunConfig
from common.results import SCHEMA_VERSION
from harness.reporting import document, limits, provenance, sections, steps, tables
from tests.harness.helpers import ROOT, fake_python, harness_in_process, run_harness


def result(backend="torch", strategy="scratch", devices=1, ips=100.0, status="ok", epochs=2):
    cfg = {
        "backend": backend,
        "strategy": strategy,
        "devices": devices,
        "simulated": True,
        "batch_size": 32 * devices,
        "lr": 0.05 * devices,
        "model": "resnet18",
        "epochs": epochs,
        "train_size": 2048,
        "test_size": 1000,
        "seed": 0,
        "dataset": "fashion-mnist",
    }
    eps = (
        [
            {
                "epoch": e + 1,
                "time_s": 2048 / ips,
                "steps": 64,
                "images": 2048,
                "images_per_s": ips,
                "train_loss": 1.0,
                "train_acc": 0.5,
                "test_acc": 0.7 + 0.01 * e,
            }
            for e in range(epochs)
        ]
        if status == "ok"
        else []
    )
    return {
        "schema_version": 1,
        "status": status,
        "config": cfg,
        "environment": {},
        "epochs": eps,
        "compile_s": 1.0,
        "params": 11175818,
        "weights_hash": "a" * 64,
        "data_hash": "b" * 64,
        "error": None if status == "ok" else "RuntimeError: boom",
        "memory": {},
    }


def test_speedup_and_efficiency_against_one_device():
    rows = tables.with_scaling(
        tables.as_results(
            [
                result(devices=2, ips=150.0),
                result(devices=1, ips=100.0),
                result(strategy="ddp", devices=2, ips=90.0),
            ]
        )
    )
    by = {(r.result.config.strategy, r.result.config.devices): r for r in rows}
    assert by[("scratch", 2)].speedup == pytest.approx(1.5)
    assert by[("scratch", 2)].efficiency == pytest.approx(0.75)
    assert by[("scratch", 1)].speedup == pytest.approx(1.0)
    assert by[("ddp", 2)].speedup is None  # no 1-device ddp run to compare with


META = {
    "command": "python -m harness",
    "started": "t0",
    "finished": "t1",
    "preset": "p",
    "device_kind": "cpu",
    "gpus": [],
    "data_source": "d",
    "backends": ["torch"],
}


def test_staging_commits_once_and_never_overwrites(tmp_path):
    dirs = []
    for _ in range(2):
        with document.Staging(tmp_path, ["torch"]) as s:
            s.run_id = "fixed-id"
            dirs.append(s.commit([result()], META))
    assert [d.name for d in dirs] == ["fixed-id", "fixed-id-2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fixed-id", "fixed-id-2"]
    saved = json.loads((dirs[0] / "results.json").read_text())
    assert saved["schema_version"] == SCHEMA_VERSION == 3 and saved["runs"][0]["params"] == 11175818
    # v1 in, v3 out
    assert saved["runs"][0]["schema_version"] == 3 and saved["runs"][0]["config"]["prefetch"] == 0


def test_an_error_leaves_no_half_written_report(tmp_path):
    with pytest.raises(RuntimeError):
        with document.Staging(tmp_path, ["torch"]) as s:
            (s.path / "partial.txt").write_text("x")
            raise RuntimeError("crash while running")
    assert list(tmp_path.iterdir()) == []


def test_render_lists_failures_and_reference_numbers():
    text = document.render(
        [result(), result(devices=2, status="failed")],
        {**META, "run_id": "r"},
        {"accuracy": True, "throughput": False},
    )
    assert "**torch scratch**, 2 device(s): failed — RuntimeError: boom" in text
    assert "13.1 s/epoch, 0.93" in text  # d2l's figures beside ours
    assert "**simulated**" in text
    assert "`aaaaaaaaaaaaaaaa` for every run" in text


def test_step_statistics_and_allreduce_figure_are_tabulated():
    r = result(devices=2, ips=2560.0)  # 0.8 s epochs of 64 steps: 12.5 ms each, as the median step
    r["config"].update(precision="bf16", compile=True)
    r["step_time"] = {
        "steps": 10,
        "median_s": 0.0125,
        "p10_s": 0.012,
        "p90_s": 0.014,
        "min_s": 0.011,
        "max_s": 0.02,
        "images_per_s": 5120.0,
    }
    r["allreduce"] = {
        "values": 11175818,
        "bytes": 44703272,
        "repeats": 10,
        "median_s": 0.0025,
        "p10_s": 0.002,
        "p90_s": 0.003,
        "gb_per_s": 17.88,
        "share_of_step": 0.2,
    }
    lines = steps.steps_table(tables.with_scaling(tables.as_results([r, result()])))
    assert (
        lines[0].startswith("| backend | strategy | devices | step ms (median) |")
        and "gradients MB" in lines[0]
    )
    assert (
        lines[2]
        == "| torch | scratch[bf16,compile] | 2 | 12.5 | 12–14 | 10 | 5120.0 | 44.7 | 2.5 | 17.88 | 20% | 1.00 |"
    )
    assert len(lines) == 3  # the run without step statistics has no row
    r["config"]["devices"] = 1  # nothing to send: no bandwidth figure
    assert steps.steps_table(tables.with_scaling(tables.as_results([r])))[2].endswith(
        "| 2.5 | — | 20% | 1.00 |"
    )
    text = document.render([r], {**META, "run_id": "x"}, {})
    assert (
        "## Step time and communication" in text
        and "bfloat16 compute" in text
        and "compile" in text
    )


def test_a_run_whose_epochs_are_not_its_steps_is_named_with_its_figures():
    """Keras's distribution before its fix: 2-step epochs of 4.35 s at a 0.83 s median step, one program
    compiled inside its epoch. The summary's s/epoch and the step time disagree: the report says by how much."""
    slow, fine = result(backend="keras", strategy="distribution", ips=2048 / 4.35), result()
    for r, median in ((slow, 0.83), (fine, 2048 / 100 / 2)):
        r["epochs"] = [{**e, "steps": 2} for e in r["epochs"]]
        r["step_time"] = {"steps": 3, "median_s": median, "p10_s": median, "p90_s": median}
    slow["compiles"] = {"warmup": 1, "epochs": 1, "timed_steps": 0}
    rows = tables.with_scaling(tables.as_results([slow, fine]))
    assert steps.consistency_notes(rows) == [
        "- **keras distribution** on 1 (sim.): its s/epoch is 2.62x its steps at the median step time "
        "(limit 1.3): something inside the timed epochs is not in a step timed alone; the framework "
        "compiled 1 program(s) inside the timed epochs"
    ]
    assert "| **2.62** |" in "\n".join(steps.steps_table(rows))
    assert "**Figures that disagree**" in document.render([slow, fine], {**META, "run_id": "x"}, {})


def test_an_epoch_faster_than_its_steps_at_the_median_step_is_named_too():
    """jax's ResNet-18 on an H200: 234-step epochs of 0.94 s against a 5.08 ms median timed step, 0.79: each timed
    step pays alone the dispatch and sync an epoch's steps overlap. Below 0.85 and beyond 1.3 the cell is bold;
    a ratio printed as 0.85 or 1.30 is not."""
    fast, fine = result(backend="jax", strategy="pmap"), result()
    fast["epochs"] = [{**e, "steps": 234, "time_s": 0.94} for e in fast["epochs"]]
    fast["step_time"] = {"steps": 50, "median_s": 0.00508, "p10_s": 0.005, "p90_s": 0.0052}
    fine["step_time"] = {"steps": 50, "median_s": 0.32, "p10_s": 0.32, "p90_s": 0.32}  # 64 x 0.32 s
    rows = tables.with_scaling(tables.as_results([fast, fine]))
    assert steps.consistency_notes(rows) == [
        "- **jax pmap** on 1 (sim.): its s/epoch is 0.79x its steps at the median step time (below "
        "0.85): its epochs overlap what each timed step, between two barriers, pays alone"
    ]
    shown = "\n".join(steps.steps_table(rows))
    assert "| **0.79** |" in shown and "| 1.00 |" in shown
    cells = [steps.consistency_cell(r) for r in (0.844, 0.846, 1.304, 1.306)]
    assert cells == ["**0.84**", "0.85", "1.30", "**1.31**"]  # flagged as printed
    text = document.render([fast, fine], {**META, "run_id": "x"}, {})
    assert (
        "below 0.85: the timed step, from barrier to barrier, charges an asynchronous framework"
        in text
    )
    assert "beyond 1.3: the epoch loses time its steps do not show (the input pipeline" in text


def resnet50_on(gpu: str, ips: float) -> dict:
    r = result(ips=ips)
    r["config"].update(
        model="resnet50",
        dataset="imagenet-synthetic",
        image_size=224,
        simulated=False,
        device_kind="gpu",
        precision="bf16",
        batch_size=256,
    )
    r["environment"] = {"devices": [gpu]}
    return r


def test_a_resnet50_report_quotes_nvidias_figures_and_compares_a_gpu_it_names():
    text = document.render(
        [resnet50_on("NVIDIA A100-SXM4-80GB", 2223.0), resnet50_on("NVIDIA H200", 3000.0)],
        {**META, "run_id": "r"},
        {},
    )
    assert (
        "model resnet50 (25.6 M parameters: 102 MB of float32 gradients per step) on 224x224 images"
        in text
    )
    assert "> **Synthetic data**: random images, not ImageNet." in text
    assert "## Published reference (ResNet-50 v1.5, one GPU)" in text and "13.1 s/epoch" not in text
    assert "| A100 | DGX A100 (A100 80GB) | mixed precision | 2,470 |" in text
    assert (
        "on NVIDIA A100-SXM4-80GB: 2,223 images/s, 90% of the published 2,470 (mixed precision)."
        in text
    )
    assert "on NVIDIA H200: 3,000 images/s; the table has no figure for this GPU." in text


def code_line(provenance) -> str:
    meta = (
        {**META, "run_id": "r"}
        if provenance is None
        else {**META, "run_id": "r", "provenance": provenance}
    )
    text = document.render([result()], meta, {})
    (line,) = [line for line in text.splitlines() if line.startswith("- Code:")]
    return line


def test_the_header_says_which_code_made_the_report_and_where():
    recorded = {"version": "0.1.0", "commit": "abc1234" + "0" * 33, "host": "gpu-7"}
    assert code_line({**recorded, "uncommitted_changes": True}) == (
        "- Code: dpbench 0.1.0, commit abc1234 (uncommitted changes), host gpu-7"
    )
    assert code_line({**recorded, "uncommitted_changes": False}) == (
        "- Code: dpbench 0.1.0, commit abc1234, host gpu-7"
    )
    assert code_line({**recorded, "uncommitted_changes": None}) == (
        "- Code: dpbench 0.1.0, commit abc1234 (uncommitted changes unknown), host gpu-7"
    )
    unknown = {"version": None, "commit": None, "uncommitted_changes": None, "host": "gpu-7"}
    assert code_line(unknown) == "- Code: dpbench unknown, commit unknown, host gpu-7"
    # results.json written before schema v3 (or a killed harness's unreadable record)
    assert code_line(None) == code_line({"host": ["a"]}) == "- Code: not recorded"


def test_a_run_records_its_provenance_in_results_json_and_its_header(tmp_path):
    """The whole path: run.py's meta, results.json's `provenance`, report.md's line."""
    python = fake_python(tmp_path, 'echo "no worker here" >&2; exit 3')
    out = tmp_path / "reports"
    args = ("--backend", "torch", "--strategy", "scratch", "--device", "cpu", "--gpus", "1")
    args += ("--dataset", "synthetic", "--quiet", "--no-check", "--python", f"torch={python}")
    before = provenance.git_commit(ROOT)
    assert run_harness(*args, "--out", str(out)).returncode == 1
    after = provenance.git_commit(ROOT)  # (someone may commit meanwhile)
    (directory,) = out.iterdir()
    recorded = json.loads((directory / "results.json").read_text())["provenance"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert recorded["commit"] in (before, after)
    assert recorded == {
        "version": version,
        "commit": recorded["commit"],
        "uncommitted_changes": recorded["uncommitted_changes"],  # whatever the tree holds now
        "host": socket.gethostname(),
        "machine": {**sysinfo.machine(), "gpus": []},  # --device cpu: no GPU
    }
    assert recorded["uncommitted_changes"] in ((True, False) if recorded["commit"] else (None,))
    text = (directory / "report.md").read_text()
    assert f"- Code: dpbench {version}, commit {provenance.short(recorded['commit'])}" in text
    assert provenance.machine_line(recorded) in text.splitlines()


def test_a_committed_v2_report_re_renders_saying_its_code_was_not_recorded(tmp_path):
    v2 = next(
        p
        for p in sorted(ROOT.glob("reports/*"))
        if (p / "results.json").exists()
        and json.loads((p / "results.json").read_text())["schema_version"] == 2
    )
    copy = tmp_path / v2.name
    shutil.copytree(v2, copy)
    out = run_harness("report", str(copy))
    assert out.returncode == 0, out.stderr
    text = (copy / "report.md").read_text()
    assert "- Code: not recorded" in text and "(schema v2)" in text
    assert (copy / "results.json").read_bytes() == (v2 / "results.json").read_bytes()


def test_the_devices_line_says_how_they_were_found_and_old_results_still_render():
    def devices_line(**meta):
        text = document.render([result()], {**META, "run_id": "r", **meta}, {})
        return next(line for line in text.splitlines() if line.startswith("- Devices: "))

    assert devices_line(
        device_kind="gpu", gpus=["NVIDIA H200"], detection="found by nvidia-smi"
    ) == ("- Devices: 1 GPU(s): NVIDIA H200, found by nvidia-smi")
    assert devices_line(detection="no GPU found: nvidia-smi is not on PATH") == (
        "- Devices: **simulated** (no GPU found: nvidia-smi is not on PATH): each device is a replica on the host "
        "CPU, so the figures measure the software path, not GPU scaling"
    )
    # results.json written before the detection line existed
    assert (
        devices_line(device_kind="gpu", gpus=["NVIDIA H200"]) == "- Devices: 1 GPU(s): NVIDIA H200"
    )
    assert devices_line().startswith("- Devices: **simulated** (no GPU was present): ")


def test_environment_lines_say_how_batches_reach_the_devices_and_how_sgd_updates():
    r = result(devices=2)
    r["environment"] = {
        "framework": "torch",
        "devices": ["NVIDIA H200", "NVIDIA H200"],
        "precision": {"mode": "fp32", "cudnn_benchmark": True},
        "input_copies": "asynchronous, 2 batches ahead: pinned host memory",
        "sgd_update": "torch._foreach_sub_",
        "compile": {"backend": "inductor", "mode": "max-autotune"},
    }
    lines = sections.environment_section(tables.as_results([r]))
    (line,) = [l for l in lines if l.startswith("- **torch scratch**")]
    assert "precision: mode=fp32, cudnn_benchmark=True" in line
    assert line.endswith(
        "; input copies: asynchronous, 2 batches ahead: pinned host memory; "
        "SGD update: torch._foreach_sub_; compile: backend=inductor, mode=max-autotune"
    )


def test_the_feeding_section_gives_each_runs_host_seconds_before_and_inside_its_timer():
    """Two epochs of 64 steps in 20.48 s, 0.64 s of puts (10 ms a step, 3.1%) and 0.5 s before each timer; an old
    result without the figures has no row, and a report of those alone no section."""
    fed, old = result(ips=100.0), result(strategy="ddp", ips=100.0)
    fed["epochs"] = [{**e, "prepare_s": 0.5, "feed_s": 0.64} for e in fed["epochs"]]
    fed["environment"] = {"input_copies": "1 batches ahead of their step: pinned host memory"}
    lines = sections.feeding_section(tables.with_scaling(tables.as_results([fed, old])))
    assert lines[0] == "## Feeding"
    (row,) = [l for l in lines if l.startswith("| torch")]
    assert (
        row
        == "| torch | scratch | 1 (sim.) | 0.50 | 10 | 3.1% | 1 batches ahead of their step: pinned host memory |"
    )
    assert sections.feeding_section(tables.with_scaling(tables.as_results([old]))) == []


def test_the_memory_section_gives_each_devices_parameters_gradients_and_the_rest_of_its_peak():
    """ResNet-18's 11,175,818 float32 parameters are 42.6 MiB; a device of a sharded run on 4 holds its 10.7 MiB
    shards of them and of their gradients. Of a 1,000 MiB peak, the rest is 1,000 - 2 x 42.6. A report of
    replicated CPU runs, with nothing beyond the parameter count to say, has no section."""
    replicated, sharded = result(strategy="ddp", devices=4), result(strategy="fsdp", devices=4)
    replicated["memory"] = {"peak_device_mb": 1000.0}
    sharded["memory"] = {"parameters_mb": 10.66}
    lines = sections.memory_section(tables.with_scaling(tables.as_results([replicated, sharded])))
    assert lines[0] == "## Memory a device holds"
    rows = [l for l in lines if l.startswith("| torch")]
    assert rows == [
        "| torch | ddp | 4 (sim.) | 42.6 | 42.6 | 1000 | 915 |",
        "| torch | fsdp | 4 (sim.) | 10.7 | 10.7 | — | — |",
    ]
    replicated["memory"] = {"peak_host_rss_mb": 600.0}
    assert sections.memory_section(tables.with_scaling(tables.as_results([replicated]))) == []


def test_a_compressed_exchange_states_its_measured_rounding_and_a_damaged_one_is_refused():
    """A --grad-dtype bf16 run's rounding is a table row, each step's distance in the order measured; a run
    without one has no row, and a rounding record that is no list of distances is refused in one line."""
    compressed, exact = result(strategy="ddp", ips=100.0), result(ips=100.0)
    compressed["config"]["grad_dtype"] = "bf16"
    compressed["rounding"] = {"against": "grad_dtype=fp32", "steps": [0.00231, 0.0031, 0.0042]}
    lines = sections.rounding_section(tables.with_scaling(tables.as_results([compressed, exact])))
    assert lines[0] == "## Compressed gradients"
    (row,) = [l for l in lines if l.startswith("| torch")]
    assert (
        row
        == "| torch | ddp[grad_dtype=bf16] | 1 (sim.) | grad_dtype=fp32 | 2.31e-03 | 3.10e-03 | 4.20e-03 |"
    )
    assert sections.rounding_section(tables.with_scaling(tables.as_results([exact]))) == []
    for bad, problem in (
        ({"steps": [0.1]}, "rounding lacks what it is measured against"),
        ({"against": "grad_dtype=fp32", "steps": []}, "rounding.steps is not a list of distances"),
        (
            {"against": "grad_dtype=fp32", "steps": [0.1, -1]},
            "rounding.steps is not a list of distances",
        ),
        (
            {"against": "grad_dtype=fp32", "steps": "0.1"},
            "rounding.steps is not a list of distances",
        ),
    ):
        assert results.result_problem({**compressed, "rounding": bad}) == problem
    assert results.result_problem(compressed) is None


def test_an_epochs_feeding_figures_must_be_finite_seconds_where_present():
    r = result()
    assert results.result_problem({**r, "epochs": [{**r["epochs"][0], "feed_s": None}]}) is None
    for bad in (-1.0, float("nan"), "1"):
        damaged = {**r, "epochs": [{**r["epochs"][0], "feed_s": bad}]}
        assert "feed_s is not a finite number" in results.result_problem(damaged)


def test_a_cpu_run_whose_framework_sees_gpus_says_so():
    r = result(devices=2)
    r["config"]["device_kind"] = "cpu"
    r["environment"] = {
        "framework": "torch",
        "devices": ["cpu (simulated device 0)"],
        "framework_gpus": 1,
    }
    lines = sections.environment_section(tables.as_results([r]))
    flag = "  - **torch itself sees 1 GPU(s), yet this run used simulated CPU devices**"
    assert any(l.startswith(flag) for l in lines)
    r["environment"]["framework_gpus"] = 0
    assert not any("itself sees" in l for l in sections.environment_section(tables.as_results([r])))


def test_the_method_says_how_batches_reach_the_devices():
    ahead, inside, resident = (
        RunConfig.from_dict({**result()["config"], **kw})
        for kw in ({"prefetch": 2}, {"prefetch": 0}, {"prefetch": 2, "resident_data": True})
    )
    assert "put on the devices 2 batches ahead of its step" in sections.input_line(ahead)
    assert "each step copies its own batch to the devices (--prefetch 0)" in sections.input_line(
        inside
    )
    assert "no copy is timed" in sections.input_line(resident)
    assert all(
        sections.input_line(c).startswith("Input: each epoch's batches are assembled")
        for c in (ahead, inside)
    )


def test_a_committed_report_renders_again_from_its_results_json():
    """reports/*/results.json (schema v1) loads and renders: every table and section of the committed report.md
    comes out the same; only the lines the report has reworded since (the devices line, the preset line, the input
    line of the method, the equivalence prose, the note on its logs) and the step and summary tables, which have
    gained a column, differ."""
    from common.results import load_results_json

    directory = next(
        p
        for p in sorted(Path(__file__).parents[2].glob("reports/*"))
        if (p / "results.json").exists()
    )
    results, meta = load_results_json(directory)
    text = document.render(results, meta, {"accuracy": True, "throughput": True})
    assert "(schema v1)" in text
    lines = set(text.splitlines())
    committed = (directory / "report.md").read_text()
    steps = committed.split("## Step time and communication")[1].split("\n## ")[0].splitlines()
    summary = committed.split("## Summary")[1].split("\n## ")[0].splitlines()
    changed = [
        l for l in committed.splitlines() if l not in lines and l not in steps and l not in summary
    ]
    reworded = (
        "- Devices:",
        "- Preset:",
        "Every backend and strategy of this report",
        "Raw numbers:",
    )
    assert all(l.startswith(reworded) for l in changed), changed
    rendered_steps = text.split("## Step time and communication")[1].split("\n## ")[0].splitlines()
    assert (
        sum(l.startswith("| ") for l in rendered_steps)
        == sum(l.startswith("| ") for l in steps)
        > 2
    )
    # the summary has gained the TFLOP/s column (the 8th): without it, every row is the committed one
    rendered_summary = text.split("## Summary")[1].split("\n## ")[0].splitlines()

    def without_flops(line: str) -> str:
        cells = line.split("|")
        return "|".join(cells[:8] + cells[9:])

    table_lines = [without_flops(l) for l in rendered_summary if l.startswith("|")]
    assert table_lines == [l for l in summary if l.startswith("|")] and len(table_lines) > 3


def profiled_result(strategy: str, conv: float, untraced: float, peak: float | None = None) -> dict:
    """A ResNet-18 run at 100 images/s (0.273 TFLOP/s achieved) with a --profile breakdown of a 100 ms step, and
    the framework's measured matmul peak where given; the host's theoretical peak 0.548 TFLOP/s."""
    r = result(strategy=strategy)
    seconds = {"conv_matmul": conv, "bn_elementwise": 0.1 - conv - untraced, "untraced": untraced}
    r["profile"] = {
        "framework": "torch",
        "trace": f"traces/torch-{strategy}-x1/rank0.trace.json.gz",
        "steps": 3,
        "step_s": 0.1,
        "trace_span_s": 0.3 if untraced < 0.05 else 0.1,
        "coverage": 1.0 if untraced < 0.05 else 0.33,
        "device": False,
        "seconds": seconds,
        "error": None,
    }
    r["environment"] = {
        "cpu_peak": {"fp32_tflops": 0.548, "basis": "2 CPUs x 32 FLOP/cycle x 8.56 GHz"}
    }
    r["peak"] = (
        {"n": 512, "tflops": {"float32": peak, "bfloat16": None}, "unmeasured": {}}
        if peak
        else None
    )
    return r


def test_the_report_says_where_each_steps_time_goes_and_how_far_each_run_is_from_the_limits(
    tmp_path,
):
    """--profile's shares per run with its trace linked, a breakdown that does not span its steps named, and each
    run's achieved TFLOP/s against its framework's measured matmul peak (measured by one run, used by all of the
    backend's rows) and the host's theoretical peak."""
    runs = [profiled_result("scratch", 0.08, 0.0, peak=0.4), profiled_result("ddp", 0.03, 0.06)]
    document.write(tmp_path, runs, {**META, "run_id": "x"})
    text = (tmp_path / "report.md").read_text()
    assert "## Where the time goes" in text and (tmp_path / "breakdown.png").is_file()
    assert (
        "| torch | scratch | 1 | 100 | — | 80% | 20% | 0% | [trace](traces/torch-scratch-x1/rank0.trace.json.gz) |"
        in text
    )
    assert "| conv & matmul | BN & element-wise | untraced | trace |" in text
    assert "- torch ddp x1: the trace spans 33% of the profiled steps' wall time" in text
    assert "## How far from the machine's limit" in text
    assert "| torch | scratch | 1 (sim.) | fp32 | 0.273 | 0.4 | 68% | 0.548 | 50% |" in text
    assert "| torch | ddp | 1 (sim.) | fp32 | 0.273 | 0.4 | 68% | 0.548 | 50% |" in text
    assert "0.273 (68% of matmul)" in text and "(2 CPUs x 32 FLOP/cycle x 8.56 GHz)" in text


def test_on_a_gpu_the_breakdown_counts_the_kernels_and_the_timed_steps_idle_time(tmp_path):
    """A GPU trace, profiled at twice the timed step (the profiler slows the host that launches the kernels): the
    shares are of the timed step, with the kernels as traced and the rest of the timed step idle."""
    r = profiled_result(
        "scratch", 0.02, 0.06
    )  # a 100 ms profiled step: 20 ms conv, 20 ms BN, 60 ms idle
    r["profile"] = {**r["profile"], "device": True, "coverage": 1.0}
    r["step_time"] = {"steps": 5, "median_s": 0.05, "p10_s": 0.05, "p90_s": 0.05}
    r["epochs"] = [{**e, "time_s": 4.0} for e in r["epochs"]]  # 64 steps: 62.5 ms an epoch's step
    cpu = profiled_result("ddp", 0.08, 0.0)
    document.write(tmp_path, [r, cpu], {**META, "run_id": "x"})
    text = (tmp_path / "report.md").read_text()
    # 50 ms timed: 40% conv, 40% BN, 20% idle; the device busy 40 ms of an epoch's 62.5 ms step, 64%
    assert (
        "| torch | scratch | 1 | 100 | 50 | 40% | 40% | 20% | 64% | — "
        "| [trace](traces/torch-scratch-x1/rank0.trace.json.gz) |" in text
    )  # (launches not counted in this record)
    assert (
        "| torch | ddp | 1 | 100 | — | 80% | 20% | 0% | — | — | [trace]" in text
    )  # no device trace
    assert "the device's idle time in a timed step" in text and "Device busy (a GPU run)" in text
    runs = {
        r["config"]["strategy"]: r
        for r in json.loads((tmp_path / "results.json").read_text())["runs"]
    }
    assert (
        runs["scratch"]["device_busy"] == pytest.approx(0.64) and runs["ddp"]["device_busy"] is None
    )


def test_a_cpu_reports_breakdown_has_no_device_busy_column():
    rows = tables.with_scaling(tables.as_results([profiled_result("scratch", 0.08, 0.0)]))
    assert "device busy" not in limits.breakdown_table(rows)[0]


# A GPU trace whose kernels overlap their predecessors' timestamps (the rule before kernel_segments clipped each to
# its predecessor's end: 60 us of the kernels' 119.8), as (name, start us, end us).
KERNELS = [
    ("void at::native::batch_norm_collect_statistics_kernel<bf16>", 0, 50),
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", 49.8, 99.8),
    ("sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", 120, 130),
    ("void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16>", 129.8, 140),
]


def kernel_events(kernels=KERNELS) -> list[dict]:
    return [
        {"ph": "X", "name": n, "ts": a, "dur": b - a, "pid": 0, "tid": 7, "cat": "kernel"}
        for n, a, b in kernels
    ]


def trace_text(events: list[dict]) -> str:
    return json.dumps({"traceEvents": events})


def stale_gpu_report(tmp_path: Path, strategies=("scratch",)) -> dict[str, Path]:
    """A GPU report of one run per strategy, each with KERNELS' trace and the breakdown the former rule read from
    it (stored in results.json): {strategy: its trace}."""
    runs, traces = [], {}
    for strategy in strategies:
        trace = tmp_path / "traces" / f"torch-{strategy}-x1" / "rank0.trace.json.gz"
        trace.parent.mkdir(parents=True)
        with gzip.open(trace, "wt") as f:
            f.write(trace_text(kernel_events()))
        r = profiled_result(strategy, 0.0, 0.0)
        stale = {"conv_matmul": 10e-6, "bn_elementwise": 50e-6, "untraced": 140e-6}
        r["profile"] = {
            **r["profile"],
            "steps": 1,
            "step_s": 200e-6,
            "device": True,
            "seconds": stale,
        }
        r["step_time"] = {"steps": 5, "median_s": 150e-6, "p10_s": 150e-6, "p90_s": 150e-6}
        r["epochs"] = [{**e, "time_s": 64 * 200e-6} for e in r["epochs"]]
        runs.append(r)
        traces[strategy] = trace
    document.write(tmp_path, runs, {**META, "run_id": "x"})
    return traces


def test_reread_traces_writes_each_breakdown_as_its_trace_gives_it_now(tmp_path):
    """A GPU report whose stored breakdown a former rule read (each kernel that overlaps its predecessor's
    timestamps clipped to its end: 60 us of the kernels' 119.8): `report --reread-traces` reads the trace again
    into results.json, device busy with it, and renders report.md from them. A 150 us timed step: 60 us of
    convolutions (40%), 49.8 of BN (33%), 10 of copies (7%), 30.2 idle (20%); an epoch's step 200 us: 60% busy."""
    stale_gpu_report(tmp_path)
    out = run_harness("report", str(tmp_path), "--reread-traces")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Re-read 1 of 1 trace(s) into ") and out.stderr == ""
    (run,) = json.loads((tmp_path / "results.json").read_text())["runs"]
    seconds = {k: round(v * 1e6, 3) for k, v in run["profile"]["seconds"].items() if v}
    assert seconds == {"conv_matmul": 60, "bn_elementwise": 49.8, "copies": 10, "untraced": 80.2}
    assert run["device_busy"] == pytest.approx(119.8 / 200)
    text = (tmp_path / "report.md").read_text()
    assert (
        "| torch | scratch | 1 | 0.2 | 0.15 | 40% | 33% | 7% | 20% | 60% | 0 graphs + 0 kernels | [trace]"
        in text
    )


def nonfinite_kernel(field: str, value: str) -> bytes:
    """KERNELS' trace with its second kernel's `field` a number JSON has not, as Python's json writes NaN and
    Infinity and as an overflowing exponent reads."""
    events = kernel_events()
    events[1][field] = "@@"
    return gzip.compress(trace_text(events).replace('"@@"', value).encode())


def truncated_gzip() -> bytes:
    whole = gzip.compress(trace_text(kernel_events()).encode())
    return whole[: len(whole) // 2]


# A trace damaged each way a report's trace can be, with what the line says of it.
DAMAGED_TRACES = {
    "random-bytes": (lambda: random.Random(0).randbytes(4096), "not a readable Chrome trace"),
    "truncated-gzip": (truncated_gzip, "not a readable Chrome trace"),
    "empty-file": (lambda: b"", "not a readable Chrome trace"),
    "not-utf8": (
        lambda: gzip.compress(b'{"traceEvents": [{"name": "\xff\xfe"}]}'),
        "not a readable Chrome trace",
    ),
    "no-events": (lambda: gzip.compress(b'{"traceEvents": []}'), "no timed events"),
    "no-event-list": (lambda: gzip.compress(b'{"displayTimeUnit": "ns"}'), "no traceEvents list"),
    "nan-duration": (lambda: nonfinite_kernel("dur", "NaN"), "not a finite number"),
    "infinite-duration": (lambda: nonfinite_kernel("dur", "Infinity"), "not a finite number"),
    "infinite-timestamp": (lambda: nonfinite_kernel("ts", "-Infinity"), "not a finite number"),
    "overflowing-timestamp": (lambda: nonfinite_kernel("ts", "1e999"), "not a finite number"),
    "nan-timestamp": (lambda: nonfinite_kernel("ts", "NaN"), "not a finite number"),
    "missing": (None, "not in the report"),
}


def profile_block(run: dict) -> str:
    """A run's profile as results.json holds it, byte for byte (a run of its runs list, indented so)."""
    return '"profile": ' + json.dumps(run["profile"], indent=2).replace("\n", "\n" + " " * 6)


@pytest.mark.parametrize("damage", list(DAMAGED_TRACES))
def test_reread_traces_keeps_a_breakdown_whose_trace_is_damaged(tmp_path, damage):
    """A report is never made worse by reading it again: where a trace is damaged, `report --reread-traces` keeps
    its run's stored breakdown byte for byte (no error in its place, no "nan" in results.json), says why in one
    line naming the run and the trace, exits 1, and re-renders the report with the other runs' breakdowns re-read;
    `report DIR` renders it afterwards."""
    traces = stale_gpu_report(tmp_path, ("scratch", "ddp"))
    make, says = DAMAGED_TRACES[damage]
    if make is None:
        traces["ddp"].unlink()
    else:
        traces["ddp"].write_bytes(make())
    before = (tmp_path / "results.json").read_text()
    stored = {r["config"]["strategy"]: r for r in json.loads(before)["runs"]}
    assert profile_block(stored["ddp"]) in before
    out = harness_in_process("report", str(tmp_path), "--reread-traces")
    assert out.returncode == 1, out.stderr
    (line,) = out.stderr.splitlines()
    assert (
        line.startswith("torch ddp x1: traces/torch-ddp-x1/rank0.trace.json.gz: ") and says in line
    )
    assert line.endswith("; its stored breakdown kept")
    assert out.stdout.startswith("Re-read 1 of 2 trace(s) into ")
    after = (tmp_path / "results.json").read_text()
    assert profile_block(stored["ddp"]) in after
    assert not any(word in after for word in ('"nan"', '"inf"', "NaN", "Infinity"))
    runs = {r["config"]["strategy"]: r for r in json.loads(after)["runs"]}
    assert runs["ddp"] == stored["ddp"]
    assert runs["scratch"]["profile"]["seconds"]["copies"] == pytest.approx(10e-6)  # re-read
    assert "| torch | ddp | 1 | 0.2 | 0.15 |" in (tmp_path / "report.md").read_text()
    again = harness_in_process("report", str(tmp_path))
    assert again.returncode == 0 and again.stderr == "", again.stderr


def test_reread_traces_says_in_one_line_which_trace_it_could_not_read_and_exits_1(tmp_path):
    """The command itself: one line on stderr per damaged trace, no traceback, exit status 1."""
    traces = stale_gpu_report(tmp_path)
    traces["scratch"].write_bytes(random.Random(1).randbytes(4096))
    before = (tmp_path / "results.json").read_bytes()
    out = run_harness("report", str(tmp_path), "--reread-traces")
    assert out.returncode == 1
    assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("torch scratch x1: traces/torch-scratch-x1/rank0.trace.json.gz: ")
    assert (tmp_path / "results.json").read_bytes() == before


def test_a_paritys_stored_breakdown_stays_where_its_profiles_give_none_now():
    """Parity's rows re-read by the same rule: a row whose profiles give no breakdown, or one of seconds that are
    not finite numbers, keeps its stored breakdown and reason, with a line saying why."""
    from harness.reporting import reasons

    stored_breakdown = {"strategy": {"conv_matmul": 0.1}, "idiom": {"conv_matmul": 0.08}}
    row = {
        "backend": "torch",
        "strategy": "scratch",
        "idiom": "torch",
        "suite_step_s": 0.1,
        "idiom_step_s": 0.08,
        "reason": "profiled (docs/profiling.md): a step takes +20 ms against its idiom's; more in x",
        "breakdown": stored_breakdown,
    }
    mine = profiled_result("scratch", 0.08, 0.0)
    for theirs in ({"conv_matmul": "nan"}, {"conv_matmul": float("inf")}, None):
        profile = theirs and {"steps": 1, "step_s": 0.08, "seconds": theirs, "error": None}
        parity = {"rows": [dict(row)], "idioms": [{"idiom": "torch", "profile": profile}]}
        (line,) = reasons.reread_breakdowns(parity, tables.as_results([mine]))
        assert line.startswith("parity torch scratch against its idiom torch: ")
        assert line.endswith("; its stored breakdown kept")
        assert parity["rows"] == [row]


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("profile", {"steps": 0, "step_s": 0.1}, "profile.steps is not a positive whole number"),
        (
            "profile",
            {"steps": 2, "step_s": 0.1, "trace": "../../etc/passwd", "error": "x"},
            "profile.trace",
        ),
        (
            "profile",
            {"steps": 2, "step_s": 0.1, "error": None, "seconds": {"conv": -1}},
            "profile.seconds",
        ),
        ("peak", {"tflops": {"float32": "fast"}}, "peak.tflops"),
        ("target", {"accuracy": 1.5, "reached": False}, "target.accuracy"),
        ("target", {"accuracy": 0.9, "reached": "yes"}, "target.reached"),
        (
            "target",
            {"accuracy": 0.9, "reached": True, "epoch": 5, "train_s": 1.0, "wall_s": 2.0},
            "target.epoch is not the run's last epoch",
        ),
        (
            "target",
            {"accuracy": 0.9, "reached": True, "epoch": 2, "train_s": -1.0, "wall_s": 2.0},
            "target.train_s",
        ),
    ],
)
def test_a_worker_result_with_a_bad_profile_or_peak_is_refused(field, value, says):
    from common.results import result_problem

    r = {**result(), "schema_version": SCHEMA_VERSION, field: value}
    assert says in result_problem(r)


@pytest.mark.parametrize("profiled_trial", [1, 2])
def test_a_configuration_shows_the_breakdown_of_its_profiled_trial_whichever_trial_represents_it(
    tmp_path, profiled_trial
):
    """Parity profiles only each side's first trial: the row's breakdown is that trial's, whichever trial the
    summary's figures come from."""
    runs = []
    for trial in (1, 2):
        r = profiled_result("scratch", 0.08, 0.0) if trial == profiled_trial else result()
        runs.append({**r, "trial": trial})
    document.write(tmp_path, runs, {**META, "run_id": "x"})
    text = (tmp_path / "report.md").read_text()
    assert "| torch | scratch | 1 | 100 |" in text and (tmp_path / "breakdown.png").is_file()


def test_a_sharded_strategy_shows_the_parameters_one_device_holds():
    """fsdp's results hold the MiB of parameters one device keeps (its shards): the summary's parameter cell says
    it beside the count; a replicated strategy's cell is the count alone."""
    sharded = result(strategy="fsdp", devices=2)
    sharded["params"], sharded["memory"] = 11_172_810, {"parameters_mb": 21.3}
    replicated = {**result(strategy="ddp", devices=2), "params": 11_172_810}
    cells = [tables.params_cell(results.Result.from_dict(r)) for r in (sharded, replicated)]
    assert cells == ["11,172,810 (21.3 MiB a device)", "11,172,810"]
