"""benchmarks/gpu_reference.py: the GPU reference's pieces as commands (its smoke run on the CPU is a benchmark
command, not a test: minutes of ResNet-18)."""

from __future__ import annotations

import subprocess
import sys

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


def test_every_training_piece_is_the_d2l_recipe_on_one_gpu_with_the_hosts_interpreter():
    lines = pieces()
    assert [line.split(":")[0] for line in lines] == [
        "1. fp32",
        "2. tf32",
        "3. bf16",
        "4. bf16-torch-levers",
        "5. bf16-jax-levers",
        "6. check",
        "7. parity",
        "8. test-torch",
        "9. test-jax",
    ]
    for line in lines[:5]:
        assert "--gpus 1 --preset d2l" in line and "--device gpu" in line
        assert "--python torch=/opt/py --python jax=/opt/py" in line
    assert "--compile --channels-last --resident-data" in lines[3]
    assert lines[6].endswith(
        "parity --backend torch,jax --gpus 1 --python torch=/opt/py --python jax=/opt/py "
        "--device gpu --repeat 4"
    )
    assert lines[7].endswith("test --backend torch --python torch=/opt/py")


def test_the_smoke_run_is_the_same_pieces_on_the_cpu_cut_to_a_few_steps():
    smoke = pieces("--smoke")
    assert all(
        "--device cpu --epochs 1" in line and "--device gpu" not in line for line in smoke[:5]
    )
    assert pieces("--piece", "2", "--smoke") == [smoke[1]]
    assert smoke[6].endswith("--device cpu --batch-size 8 --repeat 2 --timed-steps 3")


def test_a_piece_out_of_range_is_refused_in_one_line():
    out = subprocess.run(
        [sys.executable, SCRIPT, "run", "--piece", "10"], capture_output=True, text=True, timeout=60
    )
    assert (
        out.returncode == 2
        and "--piece must be 1..9 (got 10)" in out.stderr
        and "Traceback" not in out.stderr
    )
