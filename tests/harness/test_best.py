"""--best: beside each run as asked, the same run in its framework's fastest mode for the device, as its
backend.toml's [best] declares it; planned and refused without a framework (dry runs and plans only)."""

from __future__ import annotations

import pytest

from common import levers, manifest
from harness import cli
from harness.processes import devices
from harness.reporting.sections import best_section
from tests.harness.helpers import CPU, SYNTHETIC
from tests.harness.test_manifest import raw

EVERYTHING = ["--backend", "all", "--best", "--gpus", "1", *SYNTHETIC]


def planned(argv: list[str]) -> tuple[dict, dict]:
    """{backend: [variant, ...]} of the runs and of the rows that will not run, in the plan's order."""
    plan = cli.build_plan(cli.build_parser().parse_args(argv))
    runs, not_run = {}, {}
    for cfg in plan.configs:
        runs.setdefault(cfg.backend, []).append(cfg.variant)
    for cfg, _ in plan.not_run:
        not_run.setdefault(cfg.backend, []).append(cfg.variant)
    return runs, not_run


def test_on_the_cpu_each_strategy_runs_as_asked_and_at_its_best_and_jax_and_keras_once():
    runs, not_run = planned([*EVERYTHING, *CPU])
    assert runs == {
        "torch": ["scratch", "scratch[compile,channels_last]", "ddp", "ddp[compile,channels_last]"],
        "jax": ["pmap", "sharding"],
        "keras": ["ddp", "distribution"],
        "mxnet": [
            "scratch[hybridize=on]",
            "scratch[hybridize=on,compile]",
            "gluon[hybridize=on,kvstore=device]",
            "gluon[hybridize=on,kvstore=device,compile]",
        ],
    }
    assert not_run == {
        "torch": ["dp", "dp[compile,channels_last]"]
    }  # no CUDA: both rows, with the reason


def test_on_a_gpu_torchs_best_is_cuda_graphs_and_channels_last(monkeypatch):
    monkeypatch.setattr(
        devices, "detect", lambda: devices.Detection(["NVIDIA H200"], "found by nvidia-smi")
    )
    runs, not_run = planned(EVERYTHING)
    best = "compile=reduce-overhead,channels_last"
    assert runs["torch"] == [
        "scratch",
        f"scratch[{best}]",
        "dp",
        f"dp[{best}]",
        "ddp",
        f"ddp[{best}]",
    ]
    assert runs["jax"] == ["pmap", "sharding"] and runs["keras"] == ["ddp", "distribution"]
    assert runs["mxnet"][:2] == ["scratch[hybridize=on]", "scratch[hybridize=on,compile]"]
    assert not_run == {}


def test_the_levers_asked_for_go_with_both_rows():
    plan = cli.build_plan(
        cli.build_parser().parse_args(
            ["--backend", "torch", "--strategy", "scratch", *EVERYTHING[2:], *CPU]
            + ["--resident-data", "--precision", "bf16"]
        )
    )
    assert [c.variant for c in plan.configs] == [
        "scratch[bf16,resident_data]",
        "scratch[bf16,compile,channels_last,resident_data]",
    ]


def test_a_dry_run_says_what_best_switched_on_and_where_the_default_is_the_best(capsys):
    assert cli.main([*EVERYTHING, *CPU, "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert (
        "  torch: best switches on compile, channels_last: GPU: torch.compile in mode reduce-overhead"
        in text
    )
    assert (
        "  jax: best is the default: XLA already compiles the whole step (jax.jit/pmap) and replays it "
        "as one program; nothing to switch on"
    ) in text
    assert (
        "  mxnet: best switches on compile: hybridize(static_alloc=True, static_shape=True)" in text
    )


@pytest.mark.parametrize(
    "flags, dropped",
    [
        (["--compile"], "--compile"),
        (["--channels-last"], "--channels-last"),
        (["--compile", "--compile-mode", "max-autotune"], "--compile, --compile-mode"),
        # torch's default mode, asked for by name, is still a mode --best would choose
        (["--compile-mode", "default"], "--compile-mode"),
    ],
)
def test_best_with_a_lever_it_chooses_is_refused_in_one_line(capsys, flags, dropped):
    assert cli.main([*EVERYTHING, *CPU, *flags, "--dry-run"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        "harness: error: --best chooses --compile, --compile-mode, --channels-last per backend (its "
        f"backend.toml's [best]); drop {dropped} or --best"
    )


@pytest.mark.parametrize("name", manifest.known())
def test_every_backend_declares_a_best_it_runs_with_its_reason(name):
    declared, best = raw(name)["best"], manifest.load(name).best
    assert (best.gpu, best.cpu, best.why) == (declared["gpu"], declared["cpu"], declared["why"])
    assert best.why
    for kind in manifest.DEVICE_KINDS:
        assert (
            levers.refusals(manifest.load(name).levers, levers.Levers(**best.on(kind)).asked) == []
        )
    assert best.cpu.get("compile_mode", "default") != "reduce-overhead"  # CUDA graphs: GPU only


def test_a_best_table_setting_a_lever_it_does_not_decide_is_an_error():
    with pytest.raises(ValueError, match=r"\[best.cpu\] sets precision; --best decides compile"):
        manifest.read_best("torch", {"why": "x", "cpu": {"precision": "bf16"}})


def test_the_report_says_what_best_did_and_ignores_a_malformed_record():
    note = "jax: best is the default: one XLA program"
    assert best_section({"jax": note})[-2:] == [f"- {note}", ""]
    assert best_section({"jax": "two\nlines"})[-2] == "- two lines"
    assert best_section(["not", "a", "dict"]) == best_section({}) == []
