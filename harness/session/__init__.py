"""The benchmark session, what `run` and `parity` both are: a plan made, its report's staging made before any work,
the equivalence check, every planned run in turn (each in its backend's environment, built on first use), and the
report written whole, or the dry run's lines instead. `parity` hands in its own way of carrying the plan out."""
