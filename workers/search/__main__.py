"""python -m workers.search --space SPACE --task TASK [--storage URL] (see ``cli``)."""

import sys

from workers.search.cli import main

sys.exit(main())
