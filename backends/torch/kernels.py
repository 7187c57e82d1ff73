"""What torch's CPU kernels run with: the portable test pass's probe (backend.toml's [kernels_probe], run by
harness/suites/kernels.py as a script, with oneDNN's and MKL's verbose switches). A convolution and a matrix
product make oneDNN and MKL say their instruction set and threads; the `probe:` line says ATen's."""

import torch

torch.nn.functional.conv2d(torch.ones(2, 16, 8, 8), torch.ones(32, 16, 3, 3))
torch.ones(64, 64) @ torch.ones(64, 64)
print(
    f"probe: ATen capability {torch.backends.cpu.get_cpu_capability()}, "
    f"{torch.get_num_threads()} thread(s)"
)
