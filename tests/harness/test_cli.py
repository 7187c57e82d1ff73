"""Bad input exits 2 with one clear line, no traceback, and nothing written.

Every test sets the device situation itself (`--device cpu`, or a fake nvidia-smi first on PATH), so the
verdicts are the same on a host with GPUs and on one without."""

from __future__ import annotations

import dataclasses
import os

import pytest

from common import manifest
from harness import cli
from tests.harness.helpers import CPU, assert_refused, fake_nvidia_smi, run_harness


@pytest.mark.parametrize(
    "args, match",
    [
        (("--gpus", "0"), "--gpus must be at least 1"),
        (("--gpus", "abc"), "--gpus takes a device count"),
        (("--backend", "tensorflow"), "unknown backend 'tensorflow'"),
        (("--backend", "torch", "--strategy", "horovod"), "unknown strategy 'horovod'"),
        (("--backend", "torch", "--gpus", "2", "--batch-size", "1"), "smaller than the 2 devices"),
        (
            ("--backend", "torch", "--gpus", "2", "--batch-size", "65"),
            "cannot be split evenly across 2 devices",
        ),
        (
            ("--backend", "torch", "--gpus", "1,3", "--batch-size", "64"),
            "cannot be split evenly across 3 devices",
        ),
        (("--backend", "torch", "--epochs", "0"), "--epochs must be at least 1"),
        (("--backend", "torch", "--lr", "-1"), "--lr must be positive"),
        (("--backend", "torch", "--timeout", "0"), "--timeout must be positive"),
        (
            ("--backend", "torch", "--python", "torch=/nonexistent/python"),
            "is not an executable file",
        ),
        (("--backend", "torch", "--python", "nonsense"), "--python takes BACKEND=PATH"),
        (("--backend", "torch", "--no-such-flag"), "unrecognized arguments"),
        (("--backend", "torch", "--precision", "fp16"), "invalid choice: 'fp16'"),
        (
            ("--backend", "mxnet", "--precision", "bf16"),
            "mxnet refuses --precision bf16: mxnet runs float32 only",
        ),
        (
            ("--backend", "jax,mxnet", "--channels-last"),
            "jax refuses --channels-last: XLA chooses memory layouts",
        ),
        (("--backend", "torch", "--timed-steps", "-1"), "--timed-steps must be at least 0"),
        (
            ("--backend", "torch", "--prefetch", "-1"),
            "--prefetch must be between 0 and 16 (got -1)",
        ),
        (
            ("--backend", "torch", "--compile-mode", "max-autotune"),
            "--compile-mode max-autotune needs --compile",
        ),
        (
            ("--backend", "torch", "--compile", "--compile-mode", "reduce-overhead"),
            "captures CUDA graphs; there are none on the CPU",
        ),
        (
            ("--backend", "jax", "--compile", "--compile-mode", "max-autotune"),
            "jax refuses --compile-mode max-autotune",
        ),
    ],
)
def test_bad_input_is_refused(tmp_path, args, match):
    assert_refused(tmp_path, *args, match=match)


def test_missing_data_dir_is_refused(tmp_path):
    out = tmp_path / "reports"
    result = run_harness(
        "--backend", "torch", *CPU, "--data-dir", str(tmp_path / "nowhere"), "--out", str(out)
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"harness: error: --data-dir {tmp_path / 'nowhere'} does not exist"
    ]
    assert not out.exists()


def test_data_dir_without_files_is_refused(tmp_path):
    result = run_harness(
        "--backend", "torch", *CPU, "--data-dir", str(tmp_path), "--out", str(tmp_path / "r")
    )
    assert result.returncode == 2
    assert "lacks Fashion-MNIST files: train-images-idx3-ubyte" in result.stderr
    assert "Traceback" not in result.stderr


def test_dataparallel_on_cpu_is_refused(tmp_path):
    assert_refused(tmp_path, "--backend", "torch", "--strategy", "dp", match="needs CUDA GPUs")


def test_too_many_simulated_devices_is_refused(tmp_path):
    assert_refused(
        tmp_path, "--backend", "torch", "--gpus", "64", match="at most 16 simulated CPU devices"
    )


def test_more_gpus_than_present_is_refused(tmp_path):
    fake_nvidia_smi(
        tmp_path / "bin", ["0, GPU-5f9f1a2b-0000-1111-2222-333344445555, NVIDIA H100 80GB HBM3"]
    )
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": "0"}
    assert_refused(
        tmp_path,
        "--backend",
        "torch",
        "--gpus",
        "2",
        env=env,
        device=(),
        match="more devices than the 1 visible GPU(s) (0: NVIDIA H100 80GB HBM3), "
        "found by nvidia-smi (CUDA_VISIBLE_DEVICES=0)",
    )


def test_help_exits_zero():
    result = run_harness("--help")
    assert result.returncode == 0
    for flag in (
        "--backend",
        "--gpus",
        "--strategy",
        "--model",
        "--epochs",
        "--batch-size",
        "--lr",
        "--train-size",
        "--test-size",
        "--dataset",
        "--data-dir",
        "--seed",
        "--out",
        "--python",
        "--timeout",
    ):
        assert flag in result.stdout


def test_list_names_every_backend_and_strategy():
    result = run_harness("--list", *CPU)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "devices: simulated CPU devices (--device cpu)"
    for word in ("torch", "scratch", "dp", "ddp", "jax", "mxnet"):
        assert word in result.stdout
    # the speed levers, with the reason where a backend has none
    assert "  torch  --precision fp32|tf32|bf16: " in result.stdout
    assert "  jax    --channels-last: refused: XLA chooses memory layouts itself" in result.stdout


def test_pytorch_alias():
    """`pytorch` means torch (an alias declared in backends/torch/backend.toml)."""
    args = cli.build_parser().parse_args(
        ["--backend", "pytorch,jax", "--dataset", "synthetic", "--gpus", "1", *CPU]
    )
    plan = cli.build_plan(args)
    assert {c.backend for c in plan.configs} == {"torch", "jax"}


def test_backend_options_are_validated_and_expanded(monkeypatch):
    """--option NAME=V1,V2 runs one variant per value; undeclared names or values are refused."""
    real_load = manifest.load

    def with_option(name):
        b = real_load(name)
        if name == "torch":
            b = dataclasses.replace(
                b,
                options={
                    "layout": manifest.Option(
                        "layout", ("nchw", "nhwc"), "nchw", "memory format", ("scratch",)
                    )
                },
            )
        return b

    monkeypatch.setattr(manifest, "load", with_option)
    parse = lambda *a: cli.build_plan(
        cli.build_parser().parse_args(
            ["--backend", "torch", "--dataset", "synthetic", "--gpus", "1", *CPU, *a]
        )
    )
    plan = parse("--option", "layout=nchw,nhwc")
    assert sorted((c.strategy, c.variant) for c in plan.configs) == [
        ("ddp", "ddp"),
        ("scratch", "scratch[layout=nchw]"),
        ("scratch", "scratch[layout=nhwc]"),
    ]
    assert [c.options for c in parse().configs if c.strategy == "scratch"] == [{"layout": "nchw"}]
    with pytest.raises(cli.UsageError, match="unknown option 'kvstore'.*declare: layout"):
        parse("--option", "kvstore=local")
    with pytest.raises(cli.UsageError, match="layout=nhcw: choose from nchw, nhwc"):
        parse("--option", "layout=nhcw")


@pytest.mark.parametrize(
    "args, match",
    [
        (("--backend", "torch", "--save-weights", "w.npz"), "--save-weights needs exactly one run"),
        (
            ("--backend", "torch", "--strategy", "scratch", "--bn", "sync"),
            "torch scratch has no sync BatchNorm",
        ),
        (
            ("--backend", "torch", "--epochs", "0"),
            "0 evaluates the weights given with --load-weights",
        ),
        (("--backend", "torch", "--bn", "global"), "invalid choice: 'global'"),
    ],
)
def test_weights_and_batchnorm_flags_are_validated(tmp_path, args, match):
    assert_refused(tmp_path, *args, match=match)


def test_load_weights_must_be_a_valid_file_for_the_model(tmp_path):
    from common import weights

    weights.save(tmp_path / "lenet.npz", weights.initial_weights("lenet", 0))
    (tmp_path / "junk.npz").write_bytes(b"not a weights file")
    assert_refused(
        tmp_path,
        "--backend",
        "torch",
        "--load-weights",
        str(tmp_path / "junk.npz"),
        match="cannot read",
    )
    assert_refused(
        tmp_path,
        "--backend",
        "torch",
        "--load-weights",
        str(tmp_path / "lenet.npz"),
        match="does not hold resnet18 weights",
    )


def test_tf32_without_a_gpu_is_refused(tmp_path):
    assert_refused(
        tmp_path,
        "--backend",
        "torch",
        "--precision",
        "tf32",
        match="TF32 is a mode of NVIDIA tensor cores",
    )


def test_a_lever_one_backend_lacks_makes_its_rows_not_run_and_labels_the_others():
    args = cli.build_parser().parse_args(
        [
            "--backend",
            "all",
            "--gpus",
            "1",
            "--precision",
            "bf16",
            "--compile",
            "--dataset",
            "synthetic",
            *CPU,
        ]
    )
    plan = cli.build_plan(args)
    assert {c.backend for c in plan.configs} == {"torch", "jax", "keras"}
    assert {c.variant for c in plan.configs if c.backend == "jax"} == {
        "pmap[bf16,compile]",
        "sharding[bf16,compile]",
    }
    assert all(c.levers.precision == "bf16" and c.levers.compile for c in plan.configs)
    refused = [reason for c, reason in plan.not_run if c.backend == "mxnet"]
    assert refused and all(r.startswith("mxnet refuses --precision bf16") for r in refused)


# ----------------------------------------------------------------------------- subcommands


def test_no_subcommand_means_run():
    flags = ["--backend", "jax", "--gpus", "2", "--epochs", "3", *CPU]
    bare, run = cli.build_parser().parse_args(flags), cli.build_parser().parse_args(["run", *flags])
    assert bare.command is None and run.command == "run"
    assert {**vars(bare), "command": "run"} == vars(run)


@pytest.mark.parametrize(
    "command, flags",
    [
        (
            (),
            (
                "--backend",
                "--gpus",
                "--epochs",
                "--option",
                "--quiet",
                "run",
                "check",
                "test",
                "list",
                "no subcommand",
                "run --backend jax --gpus 2",
            ),
        ),
        (("run",), ("--backend", "--gpus", "--epochs", "--option", "--quiet", "--preset")),
        (
            ("check",),
            ("--backend", "--gpus", "--steps", "--model", "--bn", "--init", "(default: 1800.0)"),
        ),
        (("test",), ("--backend", "--python", "--passes", "--portable", "pytest_args")),
        (("list",), ("--device",)),
    ],
)
def test_every_command_has_help(command, flags):
    result = run_harness(*command, "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert all(flag in text for flag in flags), text
    assert f"usage: python -m harness {' '.join(command)}".strip() in text


def test_list_subcommand_is_the_list_flag():
    assert run_harness("list", *CPU).stdout == run_harness("--list", *CPU).stdout


def test_a_subcommand_comes_first(tmp_path):
    assert_refused(
        tmp_path, "--backend", "torch", "check", match="the subcommand check must come first"
    )
    assert_refused(tmp_path, "nonsense", match="invalid choice: 'nonsense'")


def test_flags_replace_the_presets_values_and_batch_and_lr_scale_with_the_devices_otherwise():
    from harness.planning.presets import PRESETS

    quick = PRESETS["quick"]
    plain = quick.with_flags(cli.build_parser().parse_args([]))
    assert plain == quick and (plain.batch(2), plain.learning_rate(2)) == (64, 0.1)
    given = quick.with_flags(
        cli.build_parser().parse_args(
            [
                "--epochs",
                "3",
                "--batch-size",
                "24",
                "--lr",
                "0.3",
                "--model",
                "lenet",
                "--timed-steps",
                "0",
            ]
        )
    )
    assert (
        given.epochs,
        given.batch(2),
        given.batch(4),
        given.learning_rate(4),
        given.model,
        given.timed_steps,
    ) == (3, 24, 24, 0.3, "lenet", 0)
    assert (given.train_size, given.test_size) == (quick.train_size, quick.test_size)
