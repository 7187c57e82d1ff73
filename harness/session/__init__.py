"""The benchmark session, what `run` and `parity` both are: a plan made, its report's staging made before any work,
the work done (benchmark.Work: run's planned runs, or parity's trials), and the report written whole, or the dry
run's lines instead. The work meets the session through one record (benchmark.Session) and one protocol
(benchmark.Work); both kinds of work carry out their runs one at a time through runs.py, and --dry-run's lines are
dryrun.py's. Parity's work lives here too: its trials and figures (paired.py) and the frameworks' idioms it
runs (idioms.py)."""
