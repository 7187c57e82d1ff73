"""Each worker's log, written line by line as its output comes (a log tailed while it runs is current)."""

from __future__ import annotations

from pathlib import Path

from harness.processes import disk


class LogNotWritten(OSError):
    """A worker's log could not be created: the launch did not start."""


class WorkerLogs:
    """Each worker's log file, written line by line (a log tailed while it runs is current), the command first.
    A write that fails mid-run (a full disk) stops that log, not the run: the run's output is still read, and
    its result says the log stopped early and why."""

    def __init__(self, paths: list[Path], headers: list[str]):
        self.files, self.broken = [], {}
        try:
            for path, header in zip(paths, headers):
                self.files.append(open(path, "w", buffering=1))
                self.files[-1].write(header + "\n")
        except OSError as e:
            self.close()
            raise LogNotWritten(e.errno, e.strerror, e.filename or str(path)) from None

    def write(self, i: int, line: str) -> None:
        if i in self.broken:
            return
        try:
            self.files[i].write(line)
        except OSError as e:
            self.broken[i] = disk.not_written(self.files[i].name, e)

    def close(self) -> None:
        for f in self.files:
            try:
                f.close()
            except OSError:
                pass  # its last lines could not be flushed: already said by write
