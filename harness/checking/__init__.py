"""Checking: the equivalence check's comparisons (equivalence.py), every backend's measurements against torch's
with their tolerances, as table rows. Pure numpy: the check's worker processes are harness/check.py's."""
