"""Does the harness cost speed? A minimal standalone PyTorch loop against the harness's torch `scratch`
run on 1 CPU device, in many short interleaved pairs.

    python3 benchmarks/harness_overhead.py [--pairs 8] [--steps 24] [--batch-size 32] [--python PATH]

Both loops start from the same canonical initial weights (common/weights.py, loaded with the torch
backend's load_canonical; checked by their fingerprint), take the same batches in the same order
(common/data/batches.py), with the same batch size, learning rate, steps and threads, and time the same thing:
the training steps after one warm-up step, not process start, data loading or evaluation. Each pair
runs the two back to back, in alternating order (A B, B A, A B, ...), so slow drifts of the machine's
load hit both sides alike. Per pair: ratio = harness images/s / standalone images/s; the figure is
the median ratio with a 95% bootstrap interval (10,000 resamples, seeded; benchmarks/paired.py).
The verdict is read off the interval, not the median: the harness costs at most 3% when the interval's
lower bound is >= 0.97; fewer than 6 pairs are always inconclusive (see benchmarks/paired.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import paired  # noqa: E402
from common import sysinfo  # noqa: E402
from harness import envs  # noqa: E402

EXIT_STATUS = """exit status:
  0  within 3%: the interval's lower bound is >= 0.97, the harness costs at most 3%
  1  slower by more than 3%: the whole interval is below 0.97
  2  usage error, or a run failed
  3  inconclusive: the interval straddles 0.97 (too noisy for the number of pairs), or fewer than
     6 pairs (95%); run more pairs"""

TEST_SIZE = 64  # the harness evaluates after the epoch (untimed); a few images keep a trial short


class RunFailed(Exception):
    """A standalone or harness run exited non-zero; the message holds its output's tail."""


def torch_python() -> str:
    from common import manifest

    return str(
        envs.ensure(
            "torch", manifest.load("torch").requirements, say=lambda m: print(m, file=sys.stderr)
        )
    )


def run(cmd: list[str], **kwargs) -> str:
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, **kwargs)
    if out.returncode:
        raise RunFailed(
            f"`{' '.join(cmd[:4])} ...` exited {out.returncode}:\n{(out.stdout + out.stderr)[-2000:]}"
        )
    return out.stdout


def standalone(args) -> dict:
    """One run of the plain loop: images/s, mean training loss, and the hashes of its start and data."""
    stdout = run(
        [
            args.python,
            "-m",
            "benchmarks.standalone_torch_loop",
            args.model,
            str(args.lr),
            str(args.steps * args.batch_size),
            str(args.batch_size),
            str(args.threads),
            str(args.seed),
        ],
        env=envs.worker_env(),
    )
    return json.loads(stdout.strip().splitlines()[-1])


def through_harness(args) -> dict:
    """One harness run (one epoch of args.steps steps), read back from its results.json."""
    with tempfile.TemporaryDirectory() as out:
        run(
            [
                sys.executable,
                "-m",
                "harness",
                "--backend",
                "torch",
                "--strategy",
                "scratch",
                "--device",
                "cpu",
                "--gpus",
                "1",
                "--model",
                args.model,
                "--train-size",
                str(args.steps * args.batch_size),
                "--test-size",
                str(TEST_SIZE),
                "--epochs",
                "1",
                "--batch-size",
                str(args.batch_size),
                "--lr",
                str(args.lr),
                "--threads",
                str(args.threads),
                "--seed",
                str(args.seed),
                "--python",
                f"torch={args.python}",
                "--out",
                out,
                "--quiet",
                "--no-check",
                "--timed-steps",
                "0",
            ]
        )
        (report,) = Path(out).iterdir()
        result = json.loads((report / "results.json").read_text())["runs"][0]
        (epoch,) = result["epochs"]
        return {
            "images_per_s": epoch["images_per_s"],
            "train_loss": epoch["train_loss"],
            "weights_hash": result["weights_hash"],
            "data_hash": result["data_hash"],
        }


def one_pair(args, index: int) -> tuple[dict, dict]:
    """Standalone first in even pairs, harness first in odd ones: A B B A A B ..."""
    if index % 2 == 0:
        plain = standalone(args)
        return plain, through_harness(args)
    harnessed = through_harness(args)
    return standalone(args), harnessed


def check_same_start(plain: dict, harnessed: dict) -> None:
    for key, what in (("weights_hash", "initial weights"), ("data_hash", "training batches")):
        if plain[key] != harnessed[key]:
            raise RunFailed(
                f"the two loops did not use the same {what}: {plain[key][:12]} vs {harnessed[key][:12]}"
            )


def median_of(runs: list[dict]) -> float:
    return statistics.median(r["images_per_s"] for r in runs)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--pairs", type=int, default=8, help="interleaved (standalone, harness) pairs (default 8)"
    )
    p.add_argument(
        "--steps", type=int, default=24, help="timed training steps per run (default 24)"
    )
    p.add_argument("--batch-size", type=int, default=32, help="default 32")
    p.add_argument(
        "--model", choices=("resnet18", "lenet"), default="resnet18", help="default resnet18"
    )
    p.add_argument("--lr", type=float, default=0.05, help="default 0.05")
    p.add_argument(
        "--threads",
        type=int,
        default=sysinfo.usable_cpus(),
        help="torch threads in both loops (default: the usable cores)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the initial weights and the batch order (default 0)",
    )
    p.add_argument(
        "--python",
        default=None,
        metavar="PATH",
        help="an interpreter that has torch (default: the project's .venvs/torch, built if needed)",
    )
    p.add_argument(
        "--confidence",
        type=float,
        default=paired.CONFIDENCE,
        help="of the bootstrap interval (default 0.95)",
    )
    p.add_argument(
        "--resamples",
        type=int,
        default=paired.RESAMPLES,
        help="bootstrap resamples (default 10000)",
    )
    args = p.parse_args()
    if (
        args.pairs < 1
        or args.steps < 1
        or args.batch_size < 1
        or args.resamples < 1
        or not 0 < args.confidence < 1
    ):
        p.error(
            "--pairs, --steps, --batch-size and --resamples must be positive, --confidence in (0, 1)"
        )
    if args.python and not os.access(args.python, os.X_OK):
        p.error(f"--python {args.python} is not an executable file")
    return args


def main() -> int:
    args = parse_args()
    args.python = args.python or torch_python()
    print(
        f"{args.model}, batch {args.batch_size}, lr {args.lr}, {args.steps} timed steps per run, "
        f"{args.threads} threads, seed {args.seed}, {args.pairs} pairs"
    )
    plain, harnessed = [], []
    try:
        for i in range(args.pairs):
            a, b = one_pair(args, i)
            check_same_start(a, b)
            plain.append(a)
            harnessed.append(b)
            first = "standalone" if i % 2 == 0 else "harness"
            print(
                f"pair {i + 1:2d} ({first} first): standalone {a['images_per_s']:7.1f}, "
                f"harness {b['images_per_s']:7.1f} images/s, ratio {b['images_per_s'] / a['images_per_s']:.3f}",
                flush=True,
            )
    except RunFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    c = paired.compare(
        [r["images_per_s"] for r in harnessed],
        [r["images_per_s"] for r in plain],
        confidence=args.confidence,
        resamples=args.resamples,
    )
    print(
        f"same start in both loops: weights {plain[0]['weights_hash'][:12]}, batches {plain[0]['data_hash'][:12]}; "
        f"mean training loss standalone {plain[0]['train_loss']:.4f}, harness {harnessed[0]['train_loss']:.4f}"
    )
    print(
        f"throughput, median of the runs: standalone {median_of(plain):.1f}, "
        f"harness {median_of(harnessed):.1f} images/s"
    )
    print(
        f"ratio harness / standalone: median {c.median:.3f}, {100 * c.confidence:g}% bootstrap interval "
        f"[{c.low:.3f}, {c.high:.3f}] ({args.resamples} resamples)"
    )
    print(f"verdict: {c.sentence('the harness', 'the standalone loop')}")
    return c.exit_code


if __name__ == "__main__":
    sys.exit(main())
