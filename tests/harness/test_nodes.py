"""Several nodes without a framework: the flags and Slurm's variables, the plan, and the faults of a run on
loopback nodes (fake node workers: one dies, the other waits on it forever)."""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import pytest

from common.config import RunConfig
from common.nodes import NodeSpec
from harness import cli
from harness.errors import UsageError
from harness.nodes import nodes
from harness.processes import runner
from tests.harness.helpers import fake_python

BASE = [
    "--backend",
    "all",
    "--model",
    "lenet",
    "--dataset",
    "synthetic",
    "--train-size",
    "64",
    "--test-size",
    "32",
    "--batch-size",
    "32",
    "--epochs",
    "1",
    "--device",
    "cpu",
]


def args(**given) -> nodes.NodeRequest:
    """The request of the node flags `given`, the others at their defaults."""
    return nodes.NodeRequest(**given)


def test_without_flags_or_slurm_one_node_runs():
    assert nodes.from_request(args(), environ={}) == nodes.Topology((1,), None, None, "")


def test_loopback_nodes_are_a_sweep_on_this_host():
    topology = nodes.from_request(args(nodes="2,1"), environ={})
    assert (topology.counts, topology.loopback, topology.coordinator) == ((1, 2), True, None)
    assert "simulated on this host over 127.0.0.1" in topology.how


def test_slurm_tasks_are_the_nodes_and_the_first_host_the_coordinator():
    environ = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_NODELIST": "gpu[07-09,12],cpu01"}
    topology = nodes.from_request(args(), environ=environ)
    assert (topology.counts, topology.node_rank, topology.coordinator) == ((4,), 3, "gpu07:29500")
    assert not topology.runs_here(3) and topology.runs_here(4)


def test_slurm_with_one_task_per_node_counts_its_nodes_and_gives_its_gpus():
    """#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8: two nodes, 8 GPUs each by default."""
    environ = {
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_NNODES": "2",
        "SLURM_NODELIST": "gpu[01-02]",
        "SLURM_GPUS_ON_NODE": "8",
    }
    topology = nodes.from_request(args(), environ=environ)
    assert (topology.counts, topology.node_rank, topology.coordinator) == ((2,), 1, "gpu01:29500")
    assert nodes.launcher_gpus(environ) == 8
    assert nodes.launcher_gpus({"SLURM_GPUS_PER_NODE": "h100:4"}) == 4
    assert nodes.launcher_gpus({}) is None


def test_a_single_slurm_task_is_one_node_as_without_slurm():
    environ = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_NNODES": "1"}
    assert nodes.from_request(args(), environ=environ) == nodes.Topology((1,), None, None, "")


def test_kubernetes_and_torchrun_variables_are_the_nodes_and_the_master_the_coordinator():
    """A Kubeflow PyTorchJob's pod (one per node): WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT."""
    environ = {
        "WORLD_SIZE": "3",
        "RANK": "2",
        "MASTER_ADDR": "job-master-0",
        "MASTER_PORT": "23456",
    }
    topology = nodes.from_request(args(), environ=environ)
    assert (topology.counts, topology.node_rank, topology.coordinator) == (
        (3,),
        2,
        "job-master-0:23456",
    )
    assert "WORLD_SIZE/RANK: node 2 of 3" in topology.how
    # the port defaults to torchrun's
    environ = {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "10.0.0.5"}
    assert nodes.from_request(args(), environ=environ).coordinator == "10.0.0.5:29500"
    # WORLD_SIZE 1: one node
    assert nodes.from_request(args(), environ={"WORLD_SIZE": "1", "RANK": "0"}).loopback


def test_torchruns_flag_spellings_are_read_as_the_suites():
    parsed = cli.parse(
        [*BASE, "--nnodes", "2", "--node_rank", "1", "--master-addr", "h", "--master-port", "7"]
    )
    topology = nodes.from_request(cli.request(parsed).nodes, environ={})
    assert (topology.counts, topology.node_rank, topology.coordinator) == ((2,), 1, "h:7")


@pytest.mark.parametrize(
    "environ, message",
    [
        (
            {"SLURM_PROCID": "0", "SLURM_NTASKS": "16", "SLURM_NNODES": "2"},
            r"Slurm runs 16 tasks on 2 node\(s\) \(SLURM_NTASKS=16, SLURM_NNODES=2\): the harness is one "
            r"task per node .* `srun --ntasks-per-node=1`",
        ),
        (
            {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_NNODES": "1"},
            "Slurm runs 8 tasks on 1 node",
        ),
        (
            {"SLURM_PROCID": "4", "SLURM_NTASKS": "4", "SLURM_NNODES": "4"},
            "SLURM_PROCID=4 is not below",
        ),
        (
            {"SLURM_PROCID": "0", "SLURM_NTASKS": "four"},
            "SLURM_NTASKS='four' is not a whole number",
        ),
        (
            {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "RANK": "0", "MASTER_ADDR": "m"},
            r"LOCAL_WORLD_SIZE=8: .*\(torchrun --nproc-per-node=1",
        ),
        ({"WORLD_SIZE": "2", "MASTER_ADDR": "m"}, "WORLD_SIZE=2 says 2 nodes, but RANK is not set"),
        ({"WORLD_SIZE": "2", "RANK": "0"}, "but MASTER_ADDR is not set"),
        ({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "m"}, "RANK=2 is not below WORLD_SIZE=2"),
        ({"WORLD_SIZE": "2", "RANK": "-1", "MASTER_ADDR": "m"}, "RANK='-1' is negative"),
        (
            {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "m", "MASTER_PORT": "x"},
            "MASTER_PORT='x'",
        ),
    ],
)
def test_inconsistent_launcher_variables_are_refused_in_one_line(environ, message):
    with pytest.raises(UsageError, match=message):
        nodes.from_request(args(), environ=environ)


@pytest.mark.parametrize(
    "nodelist, first", [("n1", "n1"), ("a[1-3]", "a1"), ("x[05]", "x05"), ("h1,h2", "h1")]
)
def test_first_slurm_host(nodelist, first):
    assert nodes.first_slurm_host(nodelist) == first


@pytest.mark.parametrize(
    "given, message",
    [
        (dict(node_rank=1), "--node-rank needs --coordinator"),
        (dict(coordinator="h:1"), "--coordinator goes with --node-rank"),
        (dict(nodes="2", node_rank=2, coordinator="h:1"), "--node-rank must be between 0 and 1"),
        (dict(nodes="2", node_rank=0, coordinator="h"), "--coordinator takes HOST:PORT"),
        (dict(nodes="1,2", node_rank=0, coordinator="h:1"), "one --nodes count"),
        (
            dict(nodes="2", node_rank=1, coordinator="h:1", interface="nosuch0"),
            r"--interface nosuch0: this host has no such interface with an IPv4 address \(it has: lo 127.0.0.1",
        ),
        (
            dict(nodes="2", node_rank=1, coordinator="h:1", local_addr="198.51.100.254"),
            r"--local-addr 198.51.100.254 is not an address of this host \(it has: lo 127.0.0.1",
        ),
        (
            dict(nodes="2", interface="lo"),
            r"--interface goes with runs across hosts \(--node-rank, or Slurm\); loopback",
        ),
        (
            dict(nodes="2", node_rank=1, coordinator="h:1", join_timeout=0.0),
            "--join-timeout must be positive and finite",
        ),
        (dict(join_timeout=-1.0), "--join-timeout must be positive and finite"),  # one host too
        (dict(peer_timeout=0.5), "--peer-timeout must be at least 1 second"),  # one host too
        (dict(nodes="0"), "--nodes must be at least 1"),
        (dict(nodes="two"), "--nodes takes a node count"),
        (dict(master_port=7), "--master-port goes with --master-addr"),
        (dict(master_addr="h", coordinator="h:1"), "not both"),
    ],
)
def test_bad_node_flags_are_refused_in_one_line(given, message):
    with pytest.raises(UsageError, match=message):
        nodes.from_request(args(**given), environ={})


def test_bad_node_flags_exit_2(capfd):
    assert cli.main([*BASE, "--nodes", "2", "--node-rank", "1"]) == 2
    assert "--node-rank needs --coordinator" in capfd.readouterr().err


def test_the_plan_runs_the_strategies_with_an_engine_on_several_nodes():
    plan = cli.build_plan(cli.parse([*BASE, "--nodes", "1,2", "--gpus", "1"]))
    several = {
        (c.backend, c.strategy, c.options.get("kvstore"))
        for c in plan.configs
        if c.nodes.count == 2
    }
    assert ("torch", "ddp", None) in several and ("mxnet", "gluon", "dist_sync") in several
    assert all(
        c.devices == 2 and c.local_devices == 1 and c.nodes.loopback
        for c in plan.configs
        if c.nodes.count == 2
    )
    refused = {(c.backend, c.strategy): why for c, why in plan.not_run if c.nodes.count == 2}
    assert "runs in one process; --nodes 2 needs" in refused[("torch", "scratch")]
    # MXNet's kvstore on one node is its own (dist_sync needs peers); the speed-up is still against it
    gluon = [c for c in plan.configs if (c.backend, c.strategy) == ("mxnet", "gluon")]
    assert {(c.nodes.count, c.options.get("kvstore")) for c in gluon} == {
        (1, "device"),
        (2, "dist_sync"),
    }


def test_a_strategy_in_one_process_asked_for_on_several_nodes_is_refused(capfd):
    assert cli.main([*BASE, "--backend", "torch", "--strategy", "scratch", "--nodes", "2"]) == 2
    assert "runs in one process" in capfd.readouterr().err


def test_a_host_runs_only_the_runs_it_takes_part_in():
    plan = cli.build_plan(
        cli.parse(
            [
                *BASE,
                "--backend",
                "torch",
                "--strategy",
                "ddp",
                "--nodes",
                "2",
                "--node-rank",
                "1",
                "--coordinator",
                "10.0.0.1:29500",
                "--gpus",
                "1",
            ]
        )
    )
    assert [c.nodes for c in plan.configs] == [NodeSpec(2, 1, "10.0.0.1:29500", loopback=False)]


# A node worker: node 1 fails at once with an error of its own; node 0 waits on it forever (as a ps-lite
# worker does on a dead peer), after writing its pid.
FAKE_NODE = r"""
import json, os, sys, time
cfg = json.load(open(sys.argv[sys.argv.index("--config") + 1]))
result = sys.argv[sys.argv.index("--result") + 1]
state = os.environ["FAKE_STATE"]
open(os.path.join(state, f"node{cfg['node_rank']}.pid"), "w").write(str(os.getpid()))
if cfg["node_rank"] == 1:
    json.dump({"schema_version": 2, "status": "failed", "config": cfg, "error": "RuntimeError: rank 1 lost its GPU"},
              open(result, "w"))
    sys.exit(1)
time.sleep(1000)
"""


def test_a_failing_node_fails_the_run_with_its_error_and_ends_the_waiting_node(
    tmp_path, monkeypatch
):
    script = tmp_path / "node.py"
    script.write_text(FAKE_NODE)
    python = fake_python(tmp_path, f'exec {sys.executable} {script} "$@"')
    monkeypatch.setenv("FAKE_STATE", str(tmp_path))
    monkeypatch.setattr(runner, "FAILED_NODE_GRACE_S", 2.0)  # (a failed node: the shorter grace)
    cfg = RunConfig(
        backend="torch",
        strategy="ddp",
        devices=2,
        nodes=NodeSpec(2, coordinator="127.0.0.1:1"),
        model="lenet",
        batch_size=32,
        timeout=120,
    ).validate()
    started = time.monotonic()
    with open(os.devnull, "w") as quiet:
        result = runner.run(
            cfg, python, tmp_path / "work", runner.Console(quiet=True, stream=quiet)
        )
    assert time.monotonic() - started < 60  # the grace, not the timeout, ended node 0
    assert result["status"] == "failed"
    assert result["error"].startswith("RuntimeError: rank 1 lost its GPU")
    assert "(then node 0: timeout: stopped 2 s after another node had ended" in result["error"]
    assert (
        result["error"].splitlines()[-1]
        == "node 1 of 2 failed first: failed: RuntimeError: rank 1 lost its GPU"
    )
    assert result["config"]["coordinator"] != "127.0.0.1:1"  # a fresh loopback port per run
    for rank in (0, 1):
        pid = int((tmp_path / f"node{rank}.pid").read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    logs = sorted(p.name for p in (tmp_path / "work" / "logs").iterdir())
    assert logs == ["torch-ddp-x2-2nodes.node0.log", "torch-ddp-x2-2nodes.node1.log"]
    configs = [
        json.loads(p.read_text())
        for p in sorted((tmp_path / "work" / "runs").glob("*.config.json"))
    ]
    assert [c["node_rank"] for c in configs] == [0, 1] and len(
        {c["coordinator"] for c in configs}
    ) == 1


def _measured(rng, key: str, shift: float = 0.0) -> dict:
    """A run's arrays as common/measurements.py stores them, for LeNet: loss, losses, grad/first/final."""
    from common.architectures import spec

    arrays = {f"{key}|loss": np.float64(2.3 + shift), f"{key}|losses": np.array([2.3 + shift, 2.2])}
    for name, shape, _ in spec("lenet"):
        for part in ("grad", "first", "final"):
            arrays[f"{key}|{part}|{name}"] = rng.standard_normal(shape)
    return arrays


def test_nodes_rows_pass_on_the_same_numbers_and_fail_on_a_different_step():
    from common.architectures import spec
    from harness.checking.equivalence import compare_nodes

    w0 = {"lenet": {name: np.zeros(shape) for name, shape, _ in spec("lenet")}}
    single = {
        **_measured(np.random.default_rng(0), "lenet|ddp|2|local"),
        **_measured(np.random.default_rng(1), "lenet|ddp:float64|2|local"),
    }
    same = compare_nodes("torch", single, (dict(single), {}), 2, w0)
    assert [(r.check, r.devices, r.status) for r in same] == [
        ("nodes vs 1 process (float64)", "2 = 2x1", "ok"),
        ("nodes vs 1 process", "2 = 2x1", "ok"),
    ]
    wrong = dict(single)
    wrong["lenet|ddp:float64|2|local|grad|fc1.weight"] = (
        wrong["lenet|ddp:float64|2|local|grad|fc1.weight"] * 0.5
    )
    assert [r.status for r in compare_nodes("torch", single, (wrong, {}), 2, w0)][0] == "FAIL"
    no_float64 = {k: v for k, v in single.items() if ":float64" not in k}
    rows = compare_nodes(
        "mxnet", single, (no_float64, {"lenet|ddp|2|local": "the kvstore sends float32"}), 2, w0
    )
    assert (rows[0].status, rows[0].note) == ("not run", "the kvstore sends float32")
