"""The one place this backend imports mxnet from: what must be settled before `import mxnet`.

* numpy aliases: numpy 1.24 removed np.bool, np.int, np.float, np.complex, np.object and
  np.str, which mxnet 1.9.1 (its final release) still uses. requirements.txt pins numpy
  1.23.5 where wheels exist (Python < 3.12); on newer Pythons numpy 1.26 is used and the
  aliases are restored here, as the builtins they always meant. A no-op on numpy < 1.24.
* threads: MXNet's engine and oneDNN size their OpenMP pools once, when the library
  loads, from OMP_NUM_THREADS. So the worker's thread count (the run's --threads, which the
  harness passes in the environment variable common.worker.THREADS_ENV, else every usable
  core, as torch uses for one process) is set here, before the import.
* fp32 means fp32: tensor-core math and TF32 off (matters only on GPU builds; the same
  precision settings for every backend).

Every other module of the backend does `from backends.mxnet.compat import mx`.
"""

from __future__ import annotations

import os

import numpy as np

from common import sysinfo
from common.worker import THREADS_ENV  # (common only: imports no framework)

REMOVED_NUMPY_ALIASES = {
    "bool": bool,
    "int": int,
    "float": float,
    "complex": complex,
    "object": object,
    "str": str,
}


def restore_numpy_aliases() -> None:
    for name, builtin in REMOVED_NUMPY_ALIASES.items():
        if name not in np.__dict__:
            setattr(np, name, builtin)


def worker_threads() -> int:
    """--threads of the run this worker process was started for (THREADS_ENV), else every usable core."""
    return int(os.environ.get(THREADS_ENV) or 0) or sysinfo.usable_cpus()


restore_numpy_aliases()
os.environ["OMP_NUM_THREADS"] = str(worker_threads())
os.environ.setdefault("MXNET_CUDA_ALLOW_TENSOR_CORE", "0")
os.environ.setdefault("MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION", "0")
# cuDNN 8 and cuBLAS 11 use TF32 for float32 on Ampere and later GPUs unless told not to (MXNet's own
# switches above predate TF32); this is the libraries' own switch, read when they load.
os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")

import mxnet as mx  # noqa: E402  (after the settings above, on purpose)

THREADS = int(os.environ["OMP_NUM_THREADS"])

__all__ = ["mx", "THREADS"]
