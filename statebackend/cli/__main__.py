"""``python -m statebackend.cli``: the ``statebackend`` command."""

import sys

from . import main

sys.exit(main())
