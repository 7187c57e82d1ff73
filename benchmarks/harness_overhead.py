"""Does the harness cost speed? A minimal standalone PyTorch loop against the harness's torch
`scratch` run on 1 device: same model, data, batch, steps and threads, one after the other.

    python3 benchmarks/harness_overhead.py [--train-size 2048] [--epochs 2] [--batch-size 32]

Prints both throughputs and their ratio (harness / standalone); the harness should be within 3%.
The standalone loop runs in the torch environment (.venvs/torch/, built if needed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The standalone loop: plain PyTorch, no harness code except the model definition and the IDX reader.
STANDALONE = r'''
import json, sys, time
import numpy as np, torch
from torch.nn import functional as F
from backends.torch.models import resnet18
from common.data import locate, load_fashion_mnist

train_size, epochs, batch, lr, threads = map(float, sys.argv[1:6])
torch.set_num_threads(int(threads))
ds = load_fashion_mnist(locate(), int(train_size), 1)
net = resnet18()
opt = torch.optim.SGD(net.parameters(), lr=lr)
x_all, y_all = torch.from_numpy(ds.x_train), torch.from_numpy(ds.y_train).long()
batch = int(batch)

def step(x, y):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    return loss.detach()

step(x_all[:batch], y_all[:batch])        # warm-up, as the harness does
seconds = images = 0.0
for epoch in range(int(epochs)):
    order = torch.from_numpy(np.random.default_rng([0, epoch]).permutation(len(y_all)))
    xs, ys = x_all[order], y_all[order]
    start = time.perf_counter()
    losses = [step(xs[i:i + batch], ys[i:i + batch]) for i in range(0, len(ys) - batch + 1, batch)]
    seconds += time.perf_counter() - start
    images += len(losses) * batch
print(json.dumps({"images_per_s": images / seconds}))
'''


def torch_python() -> str:
    from harness import envs, registry
    return str(envs.ensure("torch", registry.load("torch").requirements, say=lambda m: print(m, file=sys.stderr)))


def standalone(python: str, args) -> float:
    out = subprocess.run([python, "-c", STANDALONE, str(args.train_size), str(args.epochs), str(args.batch_size),
                          str(args.lr), str(args.threads)], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["images_per_s"]


def through_harness(python: str, args) -> float:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "harness", "--backend", "torch", "--strategy", "scratch", "--gpus", "1",
                        "--train-size", str(args.train_size), "--test-size", "100", "--epochs", str(args.epochs),
                        "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--threads", str(args.threads),
                        "--python", f"torch={python}", "--out", out, "--quiet", "--no-check", "--timed-steps", "0"],
                       cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        (report,) = Path(out).iterdir()
        epochs = json.loads((report / "results.json").read_text())["runs"][0]["epochs"]
        return sum(e["images"] for e in epochs) / sum(e["time_s"] for e in epochs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train-size", type=int, default=2048)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeats", type=int, default=2, help="alternate the two this many times; best of each")
    args = p.parse_args()
    python = torch_python()
    plain, harnessed = [], []
    for _ in range(args.repeats):
        plain.append(standalone(python, args))
        harnessed.append(through_harness(python, args))
    ratio = max(harnessed) / max(plain)
    print(f"standalone PyTorch loop: {max(plain):.1f} images/s  (runs: {', '.join(f'{v:.1f}' for v in plain)})")
    print(f"harness torch scratch x1: {max(harnessed):.1f} images/s  (runs: {', '.join(f'{v:.1f}' for v in harnessed)})")
    print(f"ratio harness / standalone: {ratio:.3f} ({'within' if ratio >= 0.97 else 'NOT within'} 3%)")
    return 0 if ratio >= 0.97 else 1


if __name__ == "__main__":
    sys.exit(main())
