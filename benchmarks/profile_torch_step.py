"""Where does a training step's time go? torch.profiler over a few ResNet-18 SGD steps.

    python3 benchmarks/profile_torch_step.py [--batch-size 32] [--steps 5] [--device cpu|cuda] [--bf16]

Runs benchmarks/torch_step_profile.py in the torch environment (.venvs/torch/, built if needed) and prints
the operators that take the most time (self time, summed over the profiled steps), and the share of convolutions.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--bf16", action="store_true", help="autocast forward and loss to bfloat16")
    p.add_argument(
        "--python",
        metavar="PATH",
        help="an interpreter that has torch (a host without network); "
        "default: .venvs/torch/, built if needed",
    )
    args = p.parse_args()
    if args.python and not os.access(args.python, os.X_OK):
        p.error(f"--python {args.python} is not an executable file")
    from common import manifest
    from harness.processes import envs

    python = args.python or str(
        envs.ensure(
            "torch", manifest.load("torch").requirements, say=lambda m: print(m, file=sys.stderr)
        )
    )
    return subprocess.run(
        [
            python,
            "-m",
            "benchmarks.torch_step_profile",
            str(args.batch_size),
            str(args.steps),
            args.device,
            "1" if args.bf16 else "0",
        ],
        cwd=ROOT,
        env=envs.worker_env(),
    ).returncode


if __name__ == "__main__":
    sys.exit(main())
