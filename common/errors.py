"""The errors of a run: a request that cannot be made (ConfigError), and the two ways a worker's run ends other than
ok or failed, as the result's status says them."""


class ConfigError(ValueError):
    """A request that cannot run. The message is one line, meant for the user."""


class Unsupported(Exception):
    """The request cannot run here (e.g. nn.DataParallel without CUDA). Reported as unavailable, with the reason."""


class Diverged(Exception):
    """The training loss became NaN or infinite. Reported as diverged."""
