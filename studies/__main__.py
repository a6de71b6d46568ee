"""python -m studies <command>: see ``studies.cli``."""

import sys

from studies.cli import main

sys.exit(main())
