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


def test_each_framework_at_its_best_comes_first_then_each_lever_alone_then_the_reference_pieces():
    lines = pieces()
    assert names(lines) == [
        "1. torch-best",
        "2. jax-resident",
        "3. torch-graphs",
        "4. resnet50-torch-channels-last",
        "5. resnet50-torch-compile",
        "6. keras",
        "7. resnet50-jax-resident",
        "8. torch-compile",
        "9. torch-resident",
        "10. torch-channels-last",
        "11. parity",
        "12. gpu-tests-torch",
        "13. gpu-tests-jax",
        "14. check",
        "15. d2l-bf16",
        "16. d2l-fp32",
        "17. profile",
        "18. resnet50",
        "19. d2l-target",
        "20. test-torch",
        "21. test-jax",
    ]
    # torch as written and at its best (--best), batches on the device, profiled; JAX beside it
    assert (
        "--backend torch --strategy scratch,ddp --gpus 1 --preset d2l --precision bf16 --best "
        "--resident-data --epochs 4 --profile 5 --no-check"
    ) in lines[0]
    assert (
        "--backend jax --gpus 1 --preset d2l --precision bf16 --resident-data --epochs 4"
        in lines[1]
    )
    # each torch lever alone, 2 epochs of the same recipe
    for line, lever in zip(
        (lines[2], *lines[7:10]),
        (
            "--compile --compile-mode reduce-overhead",
            "--compile",
            "--resident-data",
            "--channels-last",
        ),
    ):
        assert (
            f"--strategy scratch --gpus 1 --preset d2l --precision bf16 {lever} --epochs 2" in line
        )
    assert "--preset resnet50 --gpus 1 --channels-last --compile --profile 3" in lines[4]
    # Keras's own interpreter is the host's too, with its carried wheels
    assert "--backend keras" in lines[5] and "--python keras=/opt/py" in lines[5]
    for line in lines[:10]:
        assert "--device gpu" in line and "--python torch=/opt/py --python jax=/opt/py" in line
    assert lines[10].endswith("--device gpu --repeat 4")
    assert lines[11].endswith(
        "-m pytest -q -rs " + str(ROOT / "tests/backends/test_torch.py") + " -k cuda"
    )
    assert lines[13].endswith(
        "check --backend torch,jax --gpus 1 --model resnet18 --python torch=/opt/py --python jax=/opt/py"
        + " --python keras=/opt/py"
        + (f" --data-dir {gpu_reference.DATA}" if gpu_reference.DATA.is_dir() else "")
    )
    assert "--preset d2l-target --precision bf16 --repeat 3" in lines[18]
    assert lines[19].endswith("test --backend torch --python torch=/opt/py")


def test_torch_logs_its_cuda_graphs_where_a_piece_captures_them():
    for piece in gpu_reference.PIECES:
        graphs = "reduce-overhead" in piece.args or "--best" in piece.args
        assert (
            gpu_reference.piece_env(piece).get("TORCH_LOGS") == "cudagraphs,perf_hints"
        ) == graphs


def test_pieces_named_by_number_run_in_the_order_given():
    assert names(pieces("--piece", "9,6")) == ["9. torch-resident", "6. keras"]


def test_the_budget_takes_the_first_pieces_whose_minutes_fit():
    fit = gpu_reference.within_budget(gpu_reference.PIECES, 7.5)
    assert sum(p.minutes for p in fit) <= 7.5
    assert fit == gpu_reference.PIECES[: len(fit)]
    assert sum(p.minutes for p in gpu_reference.PIECES[: len(fit) + 1]) > 7.5
    assert names(pieces("--budget", "7.5")) == names(pieces())[: len(fit)]


def test_a_pytest_piece_runs_inside_its_backend():
    env = gpu_reference.piece_env(gpu_reference.PIECES[12])
    assert env["DPBENCH_BACKEND"] == "jax" and str(ROOT) in env["PYTHONPATH"].split(":")


def test_the_smoke_run_is_the_same_pieces_on_the_cpu_cut_to_a_few_steps():
    smoke = pieces("--smoke")
    assert all(
        "--device cpu --epochs 1" in line and "--device gpu" not in line for line in smoke[:10]
    )
    # CUDA graphs are refused on the CPU: the smoke run compiles without them
    assert "--compile --epochs 2" in smoke[2] and "reduce-overhead" not in smoke[2]
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
    two = gpu_reference.PIECES[14:16]
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
        (["--piece", "22"], "--piece must be 1..21 (got 22)"),
        (["--piece", "6,0"], "--piece must be 1..21 (got 0)"),
        (["--piece", "six"], "must be piece numbers, comma-separated"),
        (["--budget", "0.5"], "no piece fits 0.5 minutes"),
        (["--budget", "-1"], "must be a positive number of minutes"),
        (["--budget", "inf"], "must be a positive number of minutes"),
    ):
        out = subprocess.run(
            [sys.executable, SCRIPT, "run", *args], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, args
