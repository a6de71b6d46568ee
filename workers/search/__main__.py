"""python -m workers.search --space SPACE --task TASK [--storage URL] (see ``driver``)."""

import sys

from workers.search.driver import main

sys.exit(main())
