"""The two ways a worker's run ends other than ok or failed, as the result's status says them."""


class Unsupported(Exception):
    """The request cannot run here (e.g. nn.DataParallel without CUDA). Reported as unavailable, with the reason."""


class Diverged(Exception):
    """The training loss became NaN or infinite. Reported as diverged."""
