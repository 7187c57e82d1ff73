"""Each framework's own idiom of a training step, one short file per framework, against which
`python -m harness parity` measures the suite's strategies (docs/parity.md). The files import their
framework; this package's `driver` imports none."""
