"""Bad input of every kind: flags, weights files, data, and what a worker prints or writes.

Flags, files and data are refused before anything runs (exit 2, one line, nothing written under --out);
a worker's malformed output never stops the harness: the run becomes a failed row, or the line is ignored."""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from common import data as datalib
from common import weights
from harness import cli
from tests.harness.helpers import (
    CPU,
    TORCH_LENET,
    assert_refused,
    fake_python,
    idx_bytes,
    run_harness,
)

ONE_RUN = (
    *TORCH_LENET,
    "--train-size",
    "256",
    "--test-size",
    "256",
    "--epochs",
    "1",
    "--gpus",
    "1",
    "--no-check",
    "--timed-steps",
    "0",
    "--quiet",
)


# ---------------------------------------------------------------- 4: a worker's output


def fake_worker(tmp_path, body: str) -> str:
    """An interpreter that runs `body` with `cfg` (the run config) and `result_path` defined."""
    script = tmp_path / "worker.py"
    script.write_text(
        "import json, sys\n"
        "cfg = json.load(open(sys.argv[sys.argv.index('--config') + 1]))\n"
        "result_path = sys.argv[sys.argv.index('--result') + 1]\n" + body
    )
    return fake_python(tmp_path, f'exec {sys.executable} {script} "$@"')


GOOD_RESULT = """
epochs = [{"epoch": 1, "time_s": 2.0, "steps": 8, "images": 256, "images_per_s": 128.0, "train_loss": 1.0,
           "train_acc": 0.5, "test_acc": 0.5}]
result = {"schema_version": 1, "status": "ok", "config": cfg, "environment": {}, "epochs": epochs,
          "final_test_acc": 0.5, "compile_s": 0.5, "params": 1, "weights_hash": "w", "data_hash": "d", "error": None}
"""


def run_fake(tmp_path, python: str, *extra):
    out = tmp_path / "reports"
    result = run_harness(
        *ONE_RUN,
        *CPU,
        "--dataset",
        "synthetic",
        "--python",
        f"torch={python}",
        "--out",
        str(out),
        *extra,
    )
    assert "Traceback" not in result.stderr, result.stderr
    reports = list(out.iterdir())
    assert len(reports) == 1, result.stderr
    return result, json.loads((reports[0] / "results.json").read_text())["runs"]


def test_malformed_progress_lines_are_ignored(tmp_path):
    lines = [
        '@dpbench {"event": "step"}',
        "@dpbench [1, 2]",
        '@dpbench "step"',
        '@dpbench {"event": 3}',
        '@dpbench {"event": "warmup", "seconds": "slow"}',
        '@dpbench {"event": "warmup", "seconds": NaN}',
        '@dpbench {"event": "step", "epoch": 1, "epochs": 1, "step": 1, "steps": Infinity}',
        '@dpbench {"event": "epoch", "epoch": 1}',
        "@dpbench " + "[" * 100000,
    ]
    body = (
        "".join(f"print({line!r})\n" for line in lines)
        + GOOD_RESULT
        + "json.dump(result, open(result_path, 'w'))\n"
    )
    result, runs = run_fake(tmp_path, fake_worker(tmp_path, body))
    result_without_quiet = run_harness(
        *[a for a in ONE_RUN if a != "--quiet"],
        *CPU,
        "--dataset",
        "synthetic",
        "--python",
        f"torch={fake_worker(tmp_path, body)}",
        "--out",
        str(tmp_path / "more"),
    )
    assert result.returncode == 0 and result_without_quiet.returncode == 0, (
        result_without_quiet.stderr
    )
    assert "Traceback" not in result_without_quiet.stderr
    assert [r["status"] for r in runs] == ["ok"]


@pytest.mark.parametrize(
    "change, reason",
    [
        ("del result['config']", "its config is missing"),
        ("result['config'] = 'torch'", "its config is missing or is not the one"),
        ("result = [result]", "not a result of schema v1, v2 or v3"),
        ("result['status'] = ['ok']", "unknown status"),
        ("result['epochs'] = 'many'", "epochs is a str"),
        ("result['epochs'][0]['time_s'] = '2'", "an epoch record lacks"),
        ("result['epochs'][0]['time_s'] = 0", "an epoch took no time"),
        ("result['environment'] = {'devices': 3}", "environment.devices"),
        ("result['weights_hash'] = ['w']", "weights_hash is a list"),
        ("result['step_time'] = {'median_s': 1}", "step_time lacks a field"),
        ("result['compile_s'] = 'fast'", "compile_s is not a number"),
    ],
)
def test_a_bad_result_file_is_a_failed_row_with_the_reason(tmp_path, change, reason):
    body = GOOD_RESULT + change + "\njson.dump(result, open(result_path, 'w'))\n"
    result, runs = run_fake(tmp_path, fake_worker(tmp_path, body))
    assert result.returncode == 1
    assert [r["status"] for r in runs] == ["failed"]
    last = runs[0]["error"].splitlines()[-1]
    assert "exited with status 0 and no valid result" in last and reason in last, last


def test_a_result_file_that_is_not_json_is_a_failed_row(tmp_path):
    result, runs = run_fake(
        tmp_path, fake_worker(tmp_path, "open(result_path, 'wb').write(b'\\xff{')\n")
    )
    assert [r["status"] for r in runs] == ["failed"] and "not a JSON file" in runs[0]["error"]


def test_a_missing_result_file_is_named_as_the_report_directory_holds_it(tmp_path):
    """The staging directory (.tmp-<run-id>) is gone once the report is written: the reason names the path
    relative to the report directory, as the log's is."""
    result, runs = run_fake(tmp_path, fake_worker(tmp_path, "pass\n"))
    assert [r["status"] for r in runs] == ["failed"]
    assert (
        "runs/torch-scratch-x1.result.json" in runs[0]["error"] and ".tmp-" not in runs[0]["error"]
    )


# ------------------------------------------------------------- 5: --load-weights files


def damaged_weights(tmp_path) -> dict:
    good = tmp_path / "lenet.npz"
    weights.save(good, weights.initial_weights("lenet", 0))
    raw = good.read_bytes()
    flipped = bytearray(raw)
    flipped[len(raw) // 3] ^= 0xFF
    files = {"truncated": raw[: len(raw) // 2], "bit-flipped": bytes(flipped), "empty": b""}
    paths = {}
    for name, content in files.items():
        paths[name] = tmp_path / f"{name}.npz"
        paths[name].write_bytes(content)
    paths["npy"] = tmp_path / "array.npy"
    np.save(paths["npy"], np.zeros(3, np.float32))
    return paths


@pytest.mark.parametrize("kind", ["truncated", "bit-flipped", "empty", "npy"])
def test_damaged_weights_file_is_one_error(tmp_path, kind):
    path = damaged_weights(tmp_path)[kind]
    with pytest.raises(weights.WeightsError) as caught:
        weights.load(path, "lenet")
    assert len(str(caught.value).splitlines()) == 1
    assert_refused(tmp_path, *ONE_RUN, "--load-weights", str(path), match=str(path))


# ------------------------------------------------------------------- 7: corrupt data


def data_dir(tmp_path, monkeypatch=None, **replace) -> str:
    """Four small IDX files (10 training, 4 test images); `replace` swaps a file's bytes. With `monkeypatch`,
    their checksums become the expected ones, so what is tested is the format check behind the checksum."""
    rng = np.random.default_rng(0)
    contents = {
        "train_images": gzip.compress(idx_bytes(rng.integers(0, 256, (10, 28, 28)))),
        "train_labels": idx_bytes(np.arange(10) % 10),
        "test_images": idx_bytes(rng.integers(0, 256, (4, 28, 28))),
        "test_labels": idx_bytes(np.arange(4) % 10),
        **replace,
    }
    for key, raw in contents.items():
        stem = datalib.fashion_mnist.FILES[key][0]
        (tmp_path / (stem + (".gz" if raw[:2] == b"\x1f\x8b" else ""))).write_bytes(raw)
    if monkeypatch:
        monkeypatch.setattr(
            datalib.fashion_mnist,
            "FILES",
            {
                key: (
                    datalib.fashion_mnist.FILES[key][0],
                    hashlib.sha256(
                        gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
                    ).hexdigest(),
                )
                for key, raw in contents.items()
            },
        )
    return str(tmp_path)


def test_corrupt_data_is_refused_before_anything_runs(tmp_path):
    # checksums that do not match; the default run would check equivalence on this data first
    directory = data_dir(tmp_path)
    assert_refused(
        tmp_path,
        "--backend",
        "torch",
        "--gpus",
        "1",
        "--data-dir",
        directory,
        dataset=(),
        match="checksum mismatch",
    )
    # a truncated .gz fails before its checksum can be taken
    truncated = gzip.compress(idx_bytes(np.zeros((10, 28, 28))))[:-20]
    directory = data_dir(tmp_path, train_images=truncated)
    assert_refused(
        tmp_path,
        "--backend",
        "torch",
        "--gpus",
        "1",
        "--no-check",
        "--data-dir",
        directory,
        dataset=(),
        match="cannot read",
    )


@pytest.mark.parametrize(
    "replace, match",
    [
        ({"test_images": b"\x01\x00\x08\x03" + idx_bytes(np.zeros((4, 28, 28)))[4:]}, "bad magic"),
        ({"test_images": idx_bytes(np.zeros((4, 28, 28)))[:-5]}, "IDX size mismatch"),
        ({"train_labels": idx_bytes(np.zeros(9))}, "10 train images but 9 labels"),
        ({"test_images": idx_bytes(np.zeros((4, 28)))}, "not 28x28 images"),
    ],
)
def test_data_with_right_checksums_but_bad_content_is_refused(
    tmp_path, monkeypatch, replace, match
):
    args = cli.build_parser().parse_args(
        [
            "--backend",
            "torch",
            "--gpus",
            "1",
            *CPU,
            "--data-dir",
            data_dir(tmp_path, monkeypatch, **replace),
        ]
    )
    with pytest.raises(cli.UsageError, match=match):
        cli.build_plan(args)


def test_verified_data_gives_its_sizes(tmp_path, monkeypatch):
    assert datalib.verify(Path(data_dir(tmp_path, monkeypatch))) == (10, 4)
    args = cli.build_parser().parse_args(
        [
            "--backend",
            "torch",
            "--gpus",
            "1",
            *CPU,
            "--train-size",
            "11",
            "--batch-size",
            "2",
            "--data-dir",
            str(tmp_path),
        ]
    )
    with pytest.raises(
        cli.UsageError, match="--train-size 11 is more than the 10 training images of fashion-mnist"
    ):
        cli.build_plan(args)


# ------------------------------------------------- 8, 9, 10, 15: values refused up front


@pytest.mark.parametrize(
    "args, match",
    [
        (("--timeout", "nan"), "--timeout must be positive and finite"),  # 8
        (("--timeout", "inf"), "--timeout must be positive and finite"),
        (("--timeout", "-1"), "--timeout must be positive and finite"),
        (("--seed", "-1"), "--seed must be between 0 and 4294967295"),  # 9
        (("--seed", str(2**32)), "--seed must be between 0 and 4294967295"),
        (("--threads", "100000"), "--threads must be between 1 and 1024"),
        (("--threads", "0"), "--threads must be between 1 and 1024"),
        (("--save-weights", "/"), "--save-weights / is a directory"),
        (("--save-weights", "/etc/passwd/w.npz"), "/etc/passwd is not a directory"),
        # where the kernel refuses a file (a pseudo file system): found by a probe file, before anything runs
        (
            ("--save-weights", "/proc/nope.npz"),
            "--save-weights /proc/nope.npz: cannot write in /proc",
        ),
        (
            ("--compile-cache", "/etc/passwd"),
            "--compile-cache /etc/passwd is a file; name a folder",
        ),
        (("--compile-cache", "/proc/cache"), "--compile-cache /proc/cache: cannot write in /proc"),
        (("--gpus", "1,,2"), "--gpus '1,,2' has an empty element"),
        (("--gpus", "1,2,"), "--gpus '1,2,' has an empty element"),
        (("--gpus", ""), "argument --gpus: '' names nothing"),  # 10
        (("--strategy", ""), "argument --strategy: '' names nothing"),
        (("--strategy", ","), "argument --strategy: ',' names nothing"),
        (("--out", ""), "argument --out: must not be empty"),
        (("--save-weights", ""), "argument --save-weights: must not be empty"),
        (("--load-weights", ""), "argument --load-weights: must not be empty"),  # 15
        (("--backend", ""), "argument --backend: '' names nothing"),
        (
            ("--train-size", "100000000"),
            "--train-size 100000000 is more than the 60000 training images of synthetic",
        ),
        (
            ("--test-size", "10001"),
            "--test-size 10001 is more than the 10000 test images of synthetic",
        ),
    ],
)
def test_bad_values_are_refused(tmp_path, args, match):
    assert_refused(tmp_path, *ONE_RUN, *args, match=match)


def test_saving_after_no_training_is_refused(tmp_path):
    path = tmp_path / "w.npz"
    weights.save(path, weights.initial_weights("lenet", 0))
    assert_refused(
        tmp_path,
        *ONE_RUN,
        "--epochs",
        "0",
        "--load-weights",
        str(path),
        "--save-weights",
        str(tmp_path / "out.npz"),
        match="--save-weights with --epochs 0: nothing is trained to save",
    )


def test_an_option_no_selected_strategy_has_is_refused(tmp_path):
    assert_refused(
        tmp_path,
        "--backend",
        "mxnet",
        "--strategy",
        "scratch",
        "--option",
        "kvstore=local",
        match="--option kvstore does not apply to the selected strategies (it applies to: mxnet gluon)",
    )


def test_data_dir_that_is_a_file_is_not_a_directory(tmp_path):
    (tmp_path / "file").write_text("")
    assert_refused(
        tmp_path,
        *ONE_RUN,
        "--data-dir",
        str(tmp_path / "file"),
        dataset=(),
        match=f"--data-dir {tmp_path / 'file'} is not a directory",
    )


def test_help_states_each_default_once():
    result = run_harness("--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "(default: None)" not in text and "(default: the preset's) (default" not in text
    assert "(default: 3600.0)" in text


# --------------------------------------------------------------- 11: relative paths


def test_relative_paths_are_made_absolute_at_parsing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = cli.build_parser().parse_args(
        ["--data-dir", "data", "--load-weights", "w.npz", "--save-weights", "s.npz"]
    )
    assert (args.data_dir, args.load_weights, args.save_weights) == (
        str(tmp_path / "data"),
        str(tmp_path / "w.npz"),
        str(tmp_path / "s.npz"),
    )
    python = fake_python(tmp_path, "true", name="py")
    assert cli.parse_pythons(["torch=py"]) == {"torch": python}


def test_a_relative_python_works_from_another_directory(tmp_path):
    body = GOOD_RESULT + "json.dump(result, open(result_path, 'w'))\n"
    fake_worker(tmp_path, body)  # writes tmp_path/fake-python
    out = tmp_path / "reports"
    result = run_harness(
        *ONE_RUN,
        *CPU,
        "--dataset",
        "synthetic",
        "--python",
        "torch=./fake-python",
        "--out",
        "reports",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    runs = json.loads((next(out.iterdir()) / "results.json").read_text())["runs"]
    assert [r["status"] for r in runs] == ["ok"]


# ------------------------------------------------------------------ 12: harness check


@pytest.mark.parametrize(
    "args, match",
    [
        (("--lr", "nan"), "--lr must be positive and finite"),
        (("--lr", "-1"), "--lr must be positive and finite"),
        (("--timeout", "0"), "--timeout must be positive and finite"),
        (("--timeout", "-1"), "--timeout must be positive and finite"),
        (("--seed", "-1"), "--seed must be between 0 and 4294967295"),
        (
            ("--steps", "5000"),
            "--steps 5000 x --batch-size 16 needs more than the 60000 training images of synthetic",
        ),
        (("--steps", "0"), "--steps must be at least 1 (got 0)"),  # 15
        (("--model", ""), "argument --model: '' names nothing"),
        (("--bn", ","), "argument --bn: ',' names nothing"),
    ],
)
def test_check_refuses_bad_values(tmp_path, args, match):
    assert_refused(tmp_path, *args, command=("check",), match=match)


def test_check_refuses_corrupt_data(tmp_path):
    assert_refused(
        tmp_path,
        "--data-dir",
        data_dir(tmp_path),
        command=("check",),
        dataset=(),
        match="checksum mismatch",
    )
