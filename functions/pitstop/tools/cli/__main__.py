"""``python -m pitstop.tools.cli``."""

import sys

from pitstop.tools.cli import main

sys.exit(main())
