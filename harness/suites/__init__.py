"""What `python -m harness test` runs, below its command: the suites of each pass (catalog), the lanes that run them
(lanes), what a suite's JUnit report says (records), the portable pass's kernel caps and their evidence (kernels),
and what a pass measured, kept for the next (times). The command (harness/testing.py) keeps its flags, its main
and its printing."""
