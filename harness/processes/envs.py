"""Per-backend Python environments in .venvs/<name>/, built from pinned requirements.

An environment is built in place with venv + pip and is usable only once its stamp
(a hash of the requirements and the interpreter) is written, last. A missing or stale
stamp means: delete and rebuild. So a half-built environment is never used, and a
change of pins rebuilds it. Standard library only: this also bootstraps the harness.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness.processes import devices

ROOT = Path(__file__).resolve().parents[2]
VENVS = ROOT / ".venvs"
STAMP = ".dpbench-stamp"
# The interpreter environments are made from: the base one, also when the harness itself
# runs inside .venvs/harness/, so that the stamp does not change with how it was started.
BASE_PYTHON = os.path.realpath(getattr(sys, "_base_executable", sys.executable))


class EnvError(Exception):
    """The environment could not be built; the message holds the reason and pip's tail."""


# set by bootstrap() in the harness it re-runs: no second re-run
BOOTSTRAPPED = "DPBENCH_BOOTSTRAPPED"


def worker_env(caller=None, **extra: str) -> dict:
    """The environment of a process we start (a worker, a check, a test suite): the caller's, with the
    project root first on PYTHONPATH and the caller's entries after it (packages carried to a host
    without network stay importable), plus `extra`."""
    caller = os.environ if caller is None else caller
    path = os.pathsep.join(p for p in (str(ROOT), caller.get("PYTHONPATH", "")) if p)
    # The bootstrap's loop guard is this process's own: a harness started by a child (a test's) in an
    # interpreter without the harness's packages must still re-run itself inside .venvs/harness/.
    inherited = {k: v for k, v in caller.items() if k != BOOTSTRAPPED}
    return {**inherited, "PYTHONPATH": path, **extra}


def venv_python(name: str) -> Path:
    return VENVS / name / "bin" / "python"


def stamp_for(requirements: Path, base_python: str) -> str:
    h = hashlib.sha256()
    h.update(requirements.read_bytes())
    h.update(f"|{base_python}|{sys.version_info[:3]}".encode())
    return h.hexdigest()


def is_current(name: str, requirements: Path, base_python: str = BASE_PYTHON) -> bool:
    stamp = VENVS / name / STAMP
    return (
        venv_python(name).exists()
        and stamp.is_file()
        and stamp.read_text().strip() == stamp_for(requirements, base_python)
    )


def ensure(name: str, requirements: Path, say=print, base_python: str = BASE_PYTHON) -> Path:
    """The interpreter of .venvs/<name>/, building or rebuilding it if its pins changed."""
    VENVS.mkdir(exist_ok=True)
    with open(VENVS / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two harness runs never build the same env at once
        if is_current(name, requirements, base_python):
            return venv_python(name)
        target = VENVS / name
        if target.exists():
            say(f"Rebuilding .venvs/{name}/ ({requirements.relative_to(ROOT)} changed)")
            shutil.rmtree(target)
        else:
            say(
                f"Creating .venvs/{name}/ from {requirements.relative_to(ROOT)} (first use; takes a few minutes)"
            )
        log = VENVS / f"{name}.pip.log"
        with open(log, "w") as out:
            steps = (
                [base_python, "-m", "venv", str(target)],
                [
                    str(venv_python(name)),
                    "-m",
                    "pip",
                    "install",
                    "--disable-pip-version-check",
                    # Compiling every module pip installs was 40% of a build's CPU time; the environment compiles
                    # what it imports instead, once (keep_bytecode_inside).
                    "--no-compile",
                    "-r",
                    str(requirements),
                ],
            )
            for cmd in steps:
                if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode:
                    tail = log.read_text()[-1500:]
                    raise EnvError(
                        f"building .venvs/{name}/ failed at `{' '.join(cmd[-3:])}` "
                        f"(full log: {log.relative_to(ROOT)}):\n{tail}"
                    )
        try:
            keep_bytecode_inside(target)
            (target / STAMP).write_text(stamp_for(requirements, base_python) + "\n")
        except OSError as e:  # a full disk, say: the environment stays unstamped, rebuilt next time
            raise EnvError(f"building .venvs/{name}/ failed at its last files: {e}") from None
        return venv_python(name)


# Read by site at every start of the environment's interpreter; one line, as a .pth's code must be.
BYTECODE_PTH = "dpbench-bytecode.pth"
BYTECODE_DIR = "pycache"


def keep_bytecode_inside(target: Path) -> None:
    """Every interpreter of the environment at `target` writes the byte code of each module it compiles, once, to
    the environment's own folder (target/pycache), and reads it there after. Its packages come uncompiled
    (pip --no-compile): a module is compiled the first time something imports it, which for torch is about a
    quarter of its modules. Where PYTHONDONTWRITEBYTECODE is set (as in many images) Python would otherwise never
    write it and compile again at every start. Nothing is written outside the environment, the project's checkout
    stays as the variable asks, and a cache folder of the user's own (PYTHONPYCACHEPREFIX) is kept."""
    (site_packages,) = target.glob("lib/python*/site-packages")
    cache = str(target.resolve() / BYTECODE_DIR)
    (site_packages / BYTECODE_PTH).write_text(
        f"import sys; sys.pycache_prefix = sys.pycache_prefix or {cache!r}; sys.dont_write_bytecode = False\n"
    )


# ------------------------------------------------------------------- CPU or CUDA builds

# The oldest driver each CUDA major version runs on (CUDA's minor-version compatibility), newest first.
CUDA_DRIVERS = ((13, (580,)), (12, (525, 60, 13)))


def cuda_major(driver: tuple[int, ...] | None) -> int | None:
    """The newest CUDA major version the driver runs; None without a driver or with one older than CUDA 12's."""
    for major, oldest in CUDA_DRIVERS:
        if driver is not None and driver >= oldest:
            return major
    return None


def requirements_for(requirements: Path, driver: tuple[int, ...] | None) -> Path:
    """The pins of a backend's environment: on a host with an NVIDIA driver, the backend's CUDA build where it has
    one (requirements-cuda<major>.txt for the newest CUDA the driver runs, else requirements-cuda.txt); its CPU
    pins (requirements.txt) otherwise."""
    major = cuda_major(driver)
    if major is None:
        return requirements
    names = [f"requirements-cuda{m}.txt" for m, _ in CUDA_DRIVERS if m <= major] + [
        "requirements-cuda.txt"
    ]
    return next(
        (requirements.with_name(n) for n in names if requirements.with_name(n).is_file()),
        requirements,
    )


def ensure_backend(name: str, requirements: Path, say=print) -> Path:
    """The interpreter of a backend's environment, built from the pins this host's driver calls for."""
    return ensure(name, requirements_for(requirements, devices.driver_version()), say=say)


# ------------------------------------------------------------------- the harness's own

HARNESS_REQUIREMENTS = ROOT / "harness" / "requirements.txt"


def _missing(modules: list[str]) -> list[str]:
    import importlib.util

    return [m for m in modules if importlib.util.find_spec(m) is None]


def bootstrap(argv: list[str]) -> None:
    """Re-run the harness inside .venvs/harness/ when this interpreter lacks its dependencies.

    So that `python -m harness ...` works on a fresh machine with nothing but Python;
    with `pip install -e .[test]` done, nothing happens here.
    """
    needed = ["numpy", "matplotlib", "tqdm", "PIL"]
    needed += (
        ["pytest", "ruff", "importlinter", "mlperf_logging", "jsonschema"]
        if argv[:1] == ["test"]
        else []
    )
    if not _missing(needed) or os.environ.get(BOOTSTRAPPED):
        return
    try:
        python = ensure("harness", HARNESS_REQUIREMENTS, say=lambda m: print(m, file=sys.stderr))
    except EnvError as e:
        print(f"harness: error: {e}", file=sys.stderr)
        sys.exit(2)
    os.environ[BOOTSTRAPPED] = "1"
    # from any working folder (the `dpbench` command): the checkout on the path of the re-run harness
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
    )
    os.execv(str(python), [str(python), "-m", "harness", *argv])
