"""SIGINT, SIGTERM and SIGHUP all stop the harness the way Ctrl-C does.

`timeout`, systemd and Slurm's scancel send SIGTERM, a closed terminal SIGHUP: each must
kill the workers' process groups and write the report of what finished, like Ctrl-C. So
there is one path: `handled()` turns the first of these signals into `Interrupted` (a
KeyboardInterrupt) in the main thread, and every `except KeyboardInterrupt` deals with all three.

Later signals are only recorded: the harness is already stopping, and raising again would
abandon the clean-up half done. `held()` marks work that must not be cut short (killing a
worker's group): a first signal arriving inside it is raised when it ends. `finishing()` says
the harness is saving what it has: from then on a signal only sets the exit status.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

received: list[
    int
] = []  # the stop signals received while handled() is active, in the order they came
_state = {"stopping": False, "holding": 0}  # stopping: signals are only recorded from now on


class Interrupted(KeyboardInterrupt):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_status() -> int | None:
    """128 + the first signal's number (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP), as a shell
    reports a process killed by it; None if no stop signal came."""
    return 128 + received[0] if received else None


def _stop(signum, frame) -> None:
    received.append(signum)
    _raise_if_due()


def _raise_if_due() -> None:
    if received and not _state["stopping"] and not _state["holding"]:
        _state["stopping"] = True
        raise Interrupted(received[0])


def finishing() -> None:
    """The harness is writing its report: a signal now must not lose the results, it only sets the exit status."""
    _state["stopping"] = True


@contextmanager
def handled():
    """Inside: SIGINT, SIGTERM and SIGHUP raise Interrupted (main thread only, where Python runs handlers).

    A signal that was ignored when the harness started stays ignored: under `nohup` SIGHUP must not stop it.
    """
    received.clear()
    _state.update(stopping=False, holding=0)
    # (None: a handler set outside Python, which could not be put back; it is left alone)
    previous = {s: h for s in SIGNALS if (h := signal.getsignal(s)) not in (signal.SIG_IGN, None)}
    for s in previous:
        signal.signal(s, _stop)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        received.clear()  # what they meant is in the exit status by now


@contextmanager
def held():
    """Work that a signal must not cut short: a first stop signal arriving inside is raised when it ends
    (unless it ends with an exception of its own). Harmless where handled() is not active."""
    _state["holding"] += 1
    try:
        yield
    finally:
        _state["holding"] -= 1
    _raise_if_due()
