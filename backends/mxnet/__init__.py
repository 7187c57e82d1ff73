"""MXNet/Gluon backend: scratch and gluon (strategies.py) in mxnet 1.9.1, which compat.py imports (numpy aliases,
threads and precision settled first); BatchNorm with torch's running statistics in batchnorm.py. What a backend
is: common/backend.py; docs/ARCHITECTURE.md."""

from backends.mxnet import distributed, environment, models, parallel, strategies
from common.backend import Backend
from profilers import mxnet as profiler

# No switches: compat.py sets MXNet's threads and precision before mxnet is imported, and a float64 trainer
# casts its networks.
BACKEND = Backend("mxnet", models, parallel, strategies, environment, distributed, profiler)
