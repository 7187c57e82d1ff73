"""The orchestrator: validates a request, prepares each backend's environment, runs the
workers as subprocesses and writes the report. It never imports a framework.

At the top: the command line (cli.py, arguments.py) and one module per subcommand (run, check, parity, compare,
history, projection, testing, report), each turning its flags into a typed request at its door; errors.py, the one
error of bad input. Below them, one package per concern: planning/ (the request, the presets, the plan), session/
(the benchmark session run and parity both are), processes/, nodes/, reporting/, checking/, suites/ (what `test`
runs); none of them imports a subcommand or cli.py, and no subcommand imports another (pyproject.toml's import
contracts)."""
