"""What MXNet's CPU kernels run with: the portable test pass's probe (backend.toml's [kernels_probe], run by
harness/suites/kernels.py as a script, with oneDNN's verbose switch). A convolution makes oneDNN say its
instruction set; the `probe:` line says the core OpenBLAS chose and OpenMP's threads."""

import ctypes
import os

from backends.mxnet.compat import mx

mx.nd.Convolution(
    mx.nd.ones((2, 16, 8, 8)),
    mx.nd.ones((32, 16, 3, 3)),
    kernel=(3, 3),
    num_filter=32,
    no_bias=True,
).wait_to_read()
blas = ctypes.CDLL(os.path.join(os.path.dirname(mx.__file__), "libopenblas.so.0"))
blas.openblas_get_corename.restype = ctypes.c_char_p
omp = ctypes.CDLL("libgomp.so.1")
print(
    f"probe: OpenBLAS core {blas.openblas_get_corename().decode()}, "
    f"{omp.omp_get_max_threads()} OpenMP thread(s)"
)
