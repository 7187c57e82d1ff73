"""Scaling on paper (harness/reporting/scaling.py, `harness project`): the allreduce formulas on numbers worked by
hand, the fits recovering what made their input, the model against the committed sweep's measurements and against
NVIDIA's published 8-GPU table, and the command's bad input. No framework, no timing: the measurements are committed."""

from __future__ import annotations

import json
import shutil

import pytest

from common import manifest
from common.config import RunConfig
from common.nodes import NodeSpec
from common.results import Result, load_results_json, new_result
from harness.reporting import projected, scaling
from harness.reporting.scaling import Link, Measured, Profile
from tests.harness.helpers import run_harness
from tests.harness.test_results import COMMITTED, REPORTS

# The committed sweep of every backend on 1, 2, 4 and 8 simulated devices, and on 2 and 4 loopback nodes.
SWEEP = REPORTS / "20261124-071528-all"
NODES = REPORTS / "20261124-083120-all"
# The sharded variants and their siblings on 1, 2 and 4 simulated devices, and the later sweep of them at 8.
SHARDED = REPORTS / "20261128-205420-all"
SHARDED_8 = REPORTS / "20261129-015030-all"
# A prediction of the model (fitted at 2 devices) may be off the measured median step by this much at 4 and 8:
# on this host one command's trial medians spread by +-15% (docs/report.md, "Comparing runs"), and a prediction
# compares two single trials (the fit's and the checked one's), plus ~10% for what the model leaves out (the
# cores' caches as replicas multiply). docs/scaling.md, "Scaling on paper".
CHECK_BOUND = 0.25
# Predictions the model misses, each for a measured reason it does not describe (docs/scaling.md, "Scaling on paper").
OUTSIDE = {
    (
        "jax pmap",
        4,
    ): "XLA's CPU client at 4 simulated devices on 2 cores: 3.5 s a replica, against 2.3 at 2, 2.9 at 8",
    (
        "keras distribution",
        4,
    ): "the same XLA client (Keras on jax): 5.2 s a replica, against 2.6 at 2, 3.5 at 8",
    (
        "mxnet gluon[hybridize=on,kvstore=device]",
        8,
    ): "erratic steps on 8 contexts: 21 to 101 s, median 34",
    (
        "jax pmap across nodes",
        4,
    ): "4 jax processes on 2 cores: 3.9 s a replica, against 2.6 at 2 processes",
    ("keras ddp across nodes", 4): "faster a replica at 4 processes than at 2: 1.4 s against 2.1",
    (
        "jax fsdp",
        8,
    ): "its timed steps grew one after another, 5.4 to 10.3 s (its one-step epoch: 5.2 s)",
    (
        "keras ddp",
        8,
    ): "its timed steps grew one after another, 5.7 to 10.7 s (its one-step epoch: 5.3 s)",
    (
        "keras distribution",
        8,
    ): "XLA's CPU client at 8 simulated devices on 2 cores: 1.0 s a replica, against 0.7 at 2, 0.8 at 4",
    (
        "keras fsdp",
        8,
    ): "the same XLA client: 1.3 s a replica, against 0.7 at 2 and at 4",
}


def test_a_ring_allreduce_costs_2_n_minus_1_over_n_of_the_bytes_and_2_n_minus_1_latencies():
    link = Link(10, 1e-5)  # 10 GB/s one way, 10 us a step
    assert scaling.ring_seconds(1e9, 4, link) == pytest.approx(2 * 3 / 4 * 0.1 + 6e-5, rel=1e-12)
    assert scaling.ring_seconds(1e9, 2, link) == pytest.approx(0.1 + 2e-5, rel=1e-12)
    one_host = Profile("p", "", 8, link)
    assert scaling.allreduce_seconds(1e9, 1, one_host) == 0.0  # one device sends nothing


def test_the_hierarchical_allreduce_is_a_ring_inside_the_host_and_a_ring_of_shards_between_hosts():
    inside, nic = Link(100, 0.0), Link(10, 0.0)
    # 4 hosts of 8: 2*7/8 * 0.8 GB / 100 GB/s inside; each device's 0.1 GB shard over 1/8 of one 10 GB/s NIC
    expected = 2 * 7 / 8 * 8e8 / 100e9 + 2 * 3 / 4 * 1e8 / (10e9 / 8)
    assert scaling.hierarchical_seconds(8e8, 4, 8, inside, nic, 1) == pytest.approx(
        expected, rel=1e-12
    )
    # a NIC per device: the shard has a whole NIC, eight times faster between hosts
    faster = 2 * 7 / 8 * 8e8 / 100e9 + 2 * 3 / 4 * 1e8 / 10e9
    assert scaling.hierarchical_seconds(8e8, 4, 8, inside, nic, 8) == pytest.approx(
        faster, rel=1e-12
    )
    profile = Profile("p", "", 8, inside, nic, 1)
    assert scaling.allreduce_seconds(8e8, 32, profile) == pytest.approx(expected, rel=1e-12)
    assert scaling.allreduce_seconds(8e8, 8, profile) == pytest.approx(
        scaling.ring_seconds(8e8, 8, inside)
    )
    with pytest.raises(ValueError, match="not whole hosts"):
        scaling.allreduce_seconds(8e8, 12, profile)


def test_a_shared_host_pays_every_link_of_the_ring_on_one_bus():
    link = Link(5, 0.0)
    assert scaling.shared_ring_seconds(1e9, 8, link) == pytest.approx(2 * 7 * 1e9 / 5e9, rel=1e-12)


def shared_runs(c: float, bw: float, nbytes: float, counts) -> list[Measured]:
    """What the shared-host model says k simulated devices measure: k replicas' compute and the bus's ring."""
    return [
        Measured(
            k,
            1,
            k * c + scaling.shared_ring_seconds(nbytes, k, Link(bw, 0.0)),
            scaling.shared_ring_seconds(nbytes, k, Link(bw, 0.0)),
        )
        for k in counts
    ]


def test_the_shared_host_fit_recovers_the_compute_and_bus_that_made_its_input():
    runs = shared_runs(0.3, 4.0, 4.4e7, [2, 4, 8])
    p = scaling.pieces("x", 32, 44_000_000, runs, shared=True)
    assert p.shared_compute_s == pytest.approx(0.3, rel=1e-12)
    assert p.host_link.gb_per_s == pytest.approx(4.0, rel=1e-12)
    assert p.fitted_at == 2 and p.overlap == 0.0
    profile = scaling.host_profile(p, shared=True)
    for m in runs:
        assert scaling.project(p, profile, [m.devices])[0].step_s == pytest.approx(
            m.step_s, rel=1e-12
        )


def test_overlap_is_the_share_of_the_allreduce_the_step_does_not_pay_on_real_devices():
    one, eight = Measured(1, 1, 1.00, 0.0), Measured(8, 1, 1.05, 0.20)
    assert scaling.measured_overlap(one, eight) == pytest.approx(0.75)
    # faster than 1 device: all hidden
    assert scaling.measured_overlap(one, Measured(8, 1, 0.98, 0.2)) == 1.0
    # slower than the allreduce: none
    assert scaling.measured_overlap(one, Measured(8, 1, 1.50, 0.2)) == 0.0
    p = scaling.pieces("x", 32, 1_000_000, [one, eight], shared=False)
    assert p.overlap == pytest.approx(0.75) and p.compute_s == 1.0
    # the measured profile's ring gives back the allreduce figure it was fitted on
    profile = scaling.host_profile(p, shared=False)
    assert scaling.allreduce_seconds(1_000_000, 8, profile) == pytest.approx(0.20, rel=1e-12)
    assert scaling.project(p, profile, [8])[0].step_s == pytest.approx(1.05, rel=1e-12)


def test_efficiency_is_per_device_throughput_against_one_device():
    p = scaling.Pieces("x", 32, 4_000_000_000, 1.0, 0.0, "", ())
    profile = Profile("p", "", 8, Link(8, 0.0))
    points = scaling.project(p, profile, [1, 8])
    assert points[1].allreduce_s == pytest.approx(2 * 7 / 8 * 0.5, rel=1e-12)
    assert points[1].efficiency == pytest.approx(1 / (1 + 0.875), rel=1e-12)
    hidden = scaling.project(
        scaling.Pieces("x", 32, 4_000_000_000, 1.0, 1.0, "", ()), profile, [1, 8]
    )
    assert hidden[1].efficiency == pytest.approx(1.0)


def test_nvidias_8_gpu_table_is_within_the_models_optimism_and_bandwidth_is_not_what_limits_it():
    """Reproduce NVIDIA's published ResNet-50 DDP scaling from its own 1-GPU figures. The model never predicts
    less than was published (it counts only communication), is within 4 points at FP32/TF32 and 16 at mixed
    precision, and a tenth of the NVLink bandwidth would still leave over 94%: the rest is not the link."""
    rows = projected.published_rows()
    assert len(rows) == 6
    for r in rows:
        gap = r["projected"] - r["scaling"].efficiency
        assert 0 < gap < (0.04 if r["scaling"].precision != "mixed precision" else 0.16)
        assert r["tenth"] > 0.94
    dgx1_fp32 = next(
        r
        for r in rows
        if r["scaling"].system.startswith("DGX-1 (8x V100 16GB)")
        and r["scaling"].precision == "FP32"
    )
    # 25,557,032 float32 gradients over 8 V100 on NVLink 2 (150 GB/s one way, 5.7 us a step), 256 / 367 s a step
    ring_ms = 1e3 * (2 * 7 / 8 * 4 * 25_557_032 / 150e9 + 2 * 7 * 5.7e-6)
    assert dgx1_fp32["allreduce_ms"] == pytest.approx(ring_ms, rel=1e-12)
    assert dgx1_fp32["projected"] == pytest.approx(
        (256 / 367) / (256 / 367 + ring_ms / 1e3), rel=1e-12
    )


@pytest.mark.parametrize(
    "reports", [[SWEEP], [NODES], [SHARDED, SHARDED_8]], ids=["devices", "nodes", "sharded"]
)
def test_the_model_fitted_at_2_predicts_the_committed_sweeps_larger_counts_within_the_bound(
    reports,
):
    results = [r for report in reports for r in load_results_json(report)[0]]
    rows = projected.check_rows(projected.run_pieces(results))
    predictions = [
        (name, m.devices, projected.error(q.step_s, m.step_s))
        for name, m, q, fit in rows
        if not fit
    ]
    assert len(predictions) >= 5, "the sweep must hold runs beyond the fit point"
    off = [
        (name, k, f"{e:+.0%}")
        for name, k, e in predictions
        if abs(e) > CHECK_BOUND and (name, k) not in OUTSIDE
    ]
    assert not off, f"predictions off by more than {CHECK_BOUND:.0%}: {off}"


def test_project_writes_the_projection_beside_the_report(tmp_path):
    report = tmp_path / "run"
    shutil.copytree(COMMITTED, report)
    out = run_harness(
        "project",
        str(report),
        "--profile",
        "nvlink8-400g,pcie4-25g",
        "--max-devices",
        "64",
        "--faster",
        "100",
    )
    assert out.returncode == 0, out.stderr
    text = (report / "projection.md").read_text()
    assert "A projection, not a measurement" in text and "## Projected on pcie4-25g" in text
    assert "Compute: this run's one-device step / 100" in text
    assert "| torch ddp | 32 |" in text and "N=64" in text and "N=128" not in text
    assert (report / "projection.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p.name for p in report.iterdir() if p.name.startswith(".")]  # no temp file left


def test_project_with_a_later_sweep_checks_the_model_at_its_counts_and_refuses_another_machine(
    tmp_path,
):
    """--with joins another report's runs to DIR's (the sharded sweep at 1, 2 and 4 devices, and its runs at 8):
    the check rows hold 8 devices. A report of another machine is refused in one line."""
    report = tmp_path / "run"
    shutil.copytree(SHARDED, report)
    out = run_harness("project", str(report), "--with", str(SHARDED_8), "--max-devices", "16")
    assert out.returncode == 0, out.stderr
    text = (report / "projection.md").read_text()
    assert "| torch fsdp[reshard_after_forward=true] | 8 | 5461 |" in text
    assert "- With the runs of `20261129-015030-all`: `python -m harness" in text
    other = tmp_path / "other"
    shutil.copytree(SHARDED_8, other)
    doc = json.loads((other / "results.json").read_text())
    doc["provenance"]["machine"]["cpus"] = 16
    (other / "results.json").write_text(json.dumps(doc))
    out = run_harness("project", str(report), "--with", str(other))
    assert out.returncode == 2 and "another machine or device kind" in out.stderr


@pytest.mark.parametrize(
    "args, match",
    [
        (["--profile", "nvlink9"], "--profile nvlink9: unknown"),
        (["--max-devices", "0"], "--max-devices must be 1 to"),
        (["--faster", "nan"], "--faster must be a positive number"),
    ],
)
def test_bad_flags_are_refused_in_one_line(tmp_path, args, match):
    out = run_harness("project", str(COMMITTED), *args)
    assert out.returncode == 2 and match in out.stderr and "Traceback" not in out.stderr


def test_a_report_with_nothing_to_project_or_no_report_is_refused_in_one_line(tmp_path):
    report = tmp_path / "run"
    shutil.copytree(COMMITTED, report)
    doc = json.loads((report / "results.json").read_text())
    for run in doc["runs"]:
        run["step_time"] = None
    (report / "results.json").write_text(json.dumps(doc))
    out = run_harness("project", str(report))
    assert out.returncode == 2 and "no finished run has a step time" in out.stderr
    (report / "results.json").write_text("{not json")
    out = run_harness("project", str(report))
    assert out.returncode == 2 and "not a JSON file" in out.stderr and "Traceback" not in out.stderr
    out = run_harness("project", str(tmp_path / "absent"))
    assert out.returncode == 2 and "cannot be read" in out.stderr


def result(
    devices: int, step_s: float, allreduce_s: float, nodes: int = 1, trial=None, strategy="ddp"
):
    cfg = RunConfig(
        backend="torch",
        strategy=strategy,
        devices=devices,
        nodes=NodeSpec(nodes, coordinator="127.0.0.1:29500" if nodes > 1 else None),
        batch_size=32 * devices,
    ).to_dict()
    return Result.from_dict(
        {
            **new_result(cfg, "ok"),
            "step_time": {"median_s": step_s},
            "allreduce": {"bytes": 4_000_000, "median_s": allreduce_s},
            "trial": trial,
        }
    )


def test_runs_are_grouped_per_strategy_with_node_runs_apart_and_trials_by_their_median():
    results = [
        result(1, 0.30, 0.0),
        result(2, 0.70, 0.02, trial=1),
        result(2, 0.64, 0.03, trial=2),
        result(2, 0.66, 0.04, trial=3),
        result(2, 0.9, 0.05, nodes=2),
        result(4, 2.0, 0.15, nodes=2),
        result(2, 0.5, 0.01, strategy="scratch"),
    ]
    items = {p.name: (p, shared) for p, shared in projected.run_pieces(results)}
    assert sorted(items) == ["torch ddp", "torch ddp across nodes", "torch scratch"]
    ddp, shared = items["torch ddp"]
    assert shared and [(m.devices, m.step_s, m.allreduce_s) for m in ddp.measured] == [
        (1, 0.30, 0.0),
        (2, 0.66, 0.03),
    ]
    assert ddp.compute_s == 0.30 and ddp.shared_compute_s == pytest.approx((0.66 - 0.03) / 2)
    nodes, _ = items["torch ddp across nodes"]
    assert [m.devices for m in nodes.measured] == [2, 4] and nodes.fitted_at == 2
    # a run without a step time or allreduce figure has nothing to give
    assert projected.run_pieces([result(1, 0.0, 0.0)]) == []


def test_zero3_moves_one_and_a_half_allreduces_a_step_as_backend_toml_declares():
    """A sharded step's communication is `volume` allreduces of its gradients: torch fsdp's ZeRO-3 (two all-gathers,
    a reduce-scatter) 1.5, its ZeRO-2 and every replicated strategy 1; the shared-host fit and the projection take
    it, so the fit still gives back the runs it was made from."""
    torch = manifest.load("torch")
    assert torch.volume("fsdp", {}) == 1.5
    assert torch.volume("fsdp", {"reshard_after_forward": "false"}) == 1.0
    assert torch.volume("ddp", {}) == 1.0
    runs = [
        Measured(k, 1, k * 0.3 + 1.5 * 2 * (k - 1) * 4.4e7 / 4e9, 2 * (k - 1) * 4.4e7 / 4e9)
        for k in (2, 4)
    ]
    p = scaling.pieces("x", 32, 44_000_000, runs, shared=True, volume=1.5)
    assert p.shared_compute_s == pytest.approx(0.3, rel=1e-12)
    profile = scaling.host_profile(p, shared=True)
    point = scaling.project(p, profile, [4])[0]
    assert point.step_s == pytest.approx(runs[1].step_s, rel=1e-12)
    assert point.allreduce_s == pytest.approx(1.5 * runs[1].allreduce_s, rel=1e-12)
