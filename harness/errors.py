"""The harness's one error of bad input, raised at any floor and reported by cli.py as one line with exit status 2:
its own module, so that the concerns below the commands raise it without importing the command line."""


class UsageError(Exception):
    """Bad input: reported as one line, exit status 2."""
