import sys

from harness.processes.envs import bootstrap

bootstrap(
    sys.argv[1:]
)  # re-runs inside .venvs/harness/ if this Python lacks the harness's packages

from harness.cli import main  # noqa: E402

sys.exit(main())
