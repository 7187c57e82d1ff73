"""The orchestrator: validates a request, prepares each backend's environment, runs the
workers as subprocesses and writes the report. It never imports a framework.

At the top: the command line (cli.py, arguments.py, presets.py: the run's defaults its flags override), one module
per subcommand (run, check, parity, compare, projection, testing, report), and envs.py and devices.py, the
environments and the GPUs, which the backends' tests use too. Below them, one package per concern: planning/,
processes/, nodes/, reporting/, checking/; none of them imports a subcommand or cli.py (pyproject.toml's import
contracts)."""
