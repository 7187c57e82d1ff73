"""Checking: the equivalence check's comparisons (equivalence.py), every backend's measurements against torch's
with their tolerances, as table rows (pure numpy, no process), and its workers (workers.py), each backend's check
worker run in its environment, which `check` and the benchmark session start."""
