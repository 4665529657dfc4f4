"""``python -m statebackend.options --write docs/options.md``: refresh the reference."""

import sys

from .docs import main

sys.exit(main())
