"""``python -m statebackend.options --write docs/options.md``: refresh the reference."""

import sys

from . import StateBackendOptions
from .docs import main

sys.exit(main(StateBackendOptions))
