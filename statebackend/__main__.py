"""``python -m statebackend``: the ``statebackend`` command (as ``python -m statebackend.cli``),
for an environment whose scripts directory is not on ``PATH``."""

import sys

from .cli import main

sys.exit(main())
