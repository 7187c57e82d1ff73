"""PyTorch backend: scratch, dp and ddp (strategies.py), ddp's ranks started by torchrun's elastic agent
(distributed.py). What a backend is: common/backend.py; docs/ARCHITECTURE.md."""

from backends.torch import distributed, environment, models, parallel, strategies
from common.backend import Backend, Switches
from profilers import torch as profiler

# float32 math as --precision says, set before each trainer is built (a float64 trainer needs no switch)
SWITCHES = Switches(configure=environment.configure_precision)
BACKEND = Backend(
    "torch", models, parallel, strategies, environment, distributed, profiler, SWITCHES
)
