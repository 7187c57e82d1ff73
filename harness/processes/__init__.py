"""Processes: the workers the harness starts and how they end. runner.py starts each in its own session with a
deadline and kills its group on timeout, interrupt or exit; interrupts.py makes every stop signal one Ctrl-C path;
logs.py keeps each worker's log; disk.py says a failed write in one line."""
