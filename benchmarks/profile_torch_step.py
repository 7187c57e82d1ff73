"""Where does a training step's time go? torch.profiler over a few ResNet-18 SGD steps.

    python3 benchmarks/profile_torch_step.py [--batch-size 32] [--steps 5] [--device cpu|cuda] [--bf16]

Runs in the torch environment (.venvs/torch/, built if needed) and prints the operators that take
the most time (self time, summed over the profiled steps), and the share of convolutions.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROFILE = r'''
import sys
import torch
from torch.nn import functional as F
from torch.profiler import ProfilerActivity, profile
from backends.torch.models import resnet18

batch, steps, device, bf16 = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
torch.manual_seed(0)
net = resnet18().to(device)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
x = torch.randn(batch, 1, 28, 28, device=device)
y = torch.randint(0, 10, (batch,), device=device)

def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
        loss = F.cross_entropy(net(x), y)
    loss.backward()
    opt.step()

for _ in range(2):
    step()                                     # warm-up: allocation, autotuning
activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
with profile(activities=activities) as prof:
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
events = prof.key_averages()
total = sum(getattr(e, key) for e in events)
conv = sum(getattr(e, key) for e in events if "conv" in e.key.lower())
print(events.table(sort_by=key, row_limit=12))
print(f"convolution operators: {100 * conv / total:.0f}% of self time; "
      f"{total / steps / 1e3:.1f} ms of operator time per step")
'''


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--bf16", action="store_true", help="autocast forward and loss to bfloat16")
    p.add_argument("--python", metavar="PATH", help="an interpreter that has torch (a host without network); "
                                                    "default: .venvs/torch/, built if needed")
    args = p.parse_args()
    if args.python and not os.access(args.python, os.X_OK):
        p.error(f"--python {args.python} is not an executable file")
    from harness import envs, registry
    python = args.python or str(envs.ensure("torch", registry.load("torch").requirements,
                                             say=lambda m: print(m, file=sys.stderr)))
    return subprocess.run([python, "-c", PROFILE, str(args.batch_size), str(args.steps), args.device,
                           "1" if args.bf16 else "0"], cwd=ROOT, env=envs.worker_env()).returncode


if __name__ == "__main__":
    sys.exit(main())
