"""Benchmark commands beside the harness: the frameworks' own training loops (idioms/) that `harness parity`
measures the strategies against, the torch step profile and the GPU reference."""
