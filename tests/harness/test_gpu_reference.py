"""benchmarks/gpu_reference.py: the GPU reference's pieces as commands, in the order that buys the most certainty
per GPU minute, and the budget that picks and stops them (its smoke run on the CPU is a benchmark command, not a
test: minutes of ResNet-18)."""

from __future__ import annotations

import subprocess
import sys
import time

from benchmarks import gpu_reference
from tests.harness.helpers import ROOT

SCRIPT = str(ROOT / "benchmarks" / "gpu_reference.py")


def pieces(*args: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, SCRIPT, "list", "--python", "/opt/py", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def names(lines: list[str]) -> list[str]:
    return [line.split(" (~")[0] for line in lines]


def test_correctness_comes_first_then_the_d2l_recipe_in_bf16_on_one_gpu_with_the_hosts_interpreter():
    lines = pieces()
    assert names(lines) == [
        "1. gpu-tests-torch",
        "2. gpu-tests-jax",
        "3. check",
        "4. d2l-bf16",
        "5. d2l-fp32",
        "6. profile",
        "7. bf16-torch-levers",
        "8. bf16-jax-levers",
        "9. resnet50",
        "10. d2l-target",
        "11. parity",
        "12. test-torch",
        "13. test-jax",
    ]
    assert lines[0].endswith(
        "-m pytest -q -rs " + str(ROOT / "tests/backends/test_torch.py") + " -k cuda"
    )
    assert lines[2].endswith(
        "check --backend torch,jax --gpus 1 --model resnet18 --python torch=/opt/py --python jax=/opt/py"
        + (f" --data-dir {gpu_reference.DATA}" if gpu_reference.DATA.is_dir() else "")
    )
    for line in lines[3:8]:
        assert "--gpus 1 --preset d2l" in line and "--device gpu" in line
        assert "--python torch=/opt/py --python jax=/opt/py" in line
    assert "--strategy scratch,ddp,pmap,sharding" in lines[3] and "--precision bf16" in lines[3]
    # after the check: each run's steps profiled, the check not run again
    assert "--epochs 2 --profile 5 --no-check" in lines[5]
    assert "--compile --channels-last --resident-data --profile 5 --no-check" in lines[6]
    assert "--preset resnet50 --gpus 1 --profile 5 --no-check" in lines[8]
    assert "--preset d2l-target --precision bf16 --repeat 3" in lines[9]
    assert lines[10].endswith("--device gpu --repeat 4")
    assert lines[11].endswith("test --backend torch --python torch=/opt/py")


def test_pieces_named_by_number_run_in_the_order_given():
    assert names(pieces("--piece", "9,6")) == ["9. resnet50", "6. profile"]


def test_the_budget_takes_the_first_pieces_whose_minutes_fit():
    fit = gpu_reference.within_budget(gpu_reference.PIECES, 7.5)
    assert sum(p.minutes for p in fit) <= 7.5
    assert fit == gpu_reference.PIECES[: len(fit)]
    assert sum(p.minutes for p in gpu_reference.PIECES[: len(fit) + 1]) > 7.5
    assert names(pieces("--budget", "7.5")) == names(pieces())[: len(fit)]


def test_a_pytest_piece_runs_inside_its_backend():
    env = gpu_reference.piece_env(gpu_reference.PIECES[1])
    assert env["DPBENCH_BACKEND"] == "jax" and str(ROOT) in env["PYTHONPATH"].split(":")


def test_the_smoke_run_is_the_same_pieces_on_the_cpu_cut_to_a_few_steps():
    smoke = pieces("--smoke")
    assert all(
        "--device cpu --epochs 1" in line and "--device gpu" not in line for line in smoke[3:7]
    )
    assert pieces("--piece", "5", "--smoke") == [smoke[4]]
    assert smoke[10].endswith("--device cpu --batch-size 8 --repeat 2 --timed-steps 3")


# A piece that writes what it finished on SIGTERM, as the harness does, and would otherwise run a minute.
WRITES_ON_SIGTERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: (print('report written', flush=True), sys.exit(0)))\n"
    "print('started', flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_piece_running_past_the_budget_is_stopped_with_sigterm_and_counted_as_cut_off(
    monkeypatch, capfd
):
    monkeypatch.setattr(
        gpu_reference, "command", lambda *a: [sys.executable, "-c", WRITES_ON_SIGTERM]
    )
    two = gpu_reference.PIECES[3:5]
    started = time.monotonic()
    status = gpu_reference.run(two, python=None, smoke=False, deadline=time.monotonic() + 1)
    out = capfd.readouterr().out
    assert status == 1 and time.monotonic() - started < 30
    lines = out.splitlines()
    # the second piece never started
    assert lines.count("started") == 1 and "report written" in lines
    assert "0 of 2 pieces ok; failed: d2l-bf16 (cut off at the budget)" in out


def test_a_piece_out_of_range_or_a_budget_nothing_fits_is_refused_in_one_line():
    for args, says in (
        (["--piece", "14"], "--piece must be 1..13 (got 14)"),
        (["--piece", "6,0"], "--piece must be 1..13 (got 0)"),
        (["--piece", "six"], "must be piece numbers, comma-separated"),
        (["--budget", "0.5"], "no piece fits 0.5 minutes"),
        (["--budget", "-1"], "must be a positive number of minutes"),
        (["--budget", "inf"], "must be a positive number of minutes"),
    ):
        out = subprocess.run(
            [sys.executable, SCRIPT, "run", *args], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, args
