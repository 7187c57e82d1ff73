"""The profiled side of benchmarks/profile_torch_step.py, run in the torch environment:

python -m benchmarks.torch_step_profile BATCH STEPS cpu|cuda 0|1(bf16)
"""

import sys

import torch
from torch.nn import functional as F
from torch.profiler import ProfilerActivity, profile

from backends.torch.models import resnet18


def main(argv: list[str]) -> None:
    batch, steps, device, bf16 = int(argv[0]), int(argv[1]), argv[2], argv[3] == "1"
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
        step()  # warm-up: allocation, autotuning
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
    print(
        f"convolution operators: {100 * conv / total:.0f}% of self time; "
        f"{total / steps / 1e3:.1f} ms of operator time per step"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
