import sys

from harness.processes.envs import bootstrap

# re-runs inside .venvs/harness/ if this Python lacks the harness's packages
bootstrap(sys.argv[1:])

from harness.cli import main  # noqa: E402

sys.exit(main())
