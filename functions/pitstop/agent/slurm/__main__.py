"""``python -m pitstop.agent.slurm``: the agent (or, with ``--run-check``, a check's runner)."""

import sys

from pitstop.agent.slurm.cli import main

if __name__ == "__main__":
    sys.exit(main())
