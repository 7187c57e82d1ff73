"""The orchestrator: validates a request, prepares each backend's environment, runs the
workers as subprocesses and writes the report. It never imports a framework."""
