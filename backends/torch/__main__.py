from backends.torch import BACKEND
from common.worker import run_module

if __name__ == "__main__":
    run_module(BACKEND)
