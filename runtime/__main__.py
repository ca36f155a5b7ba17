"""``python -m quantrt`` is the ``quantrt`` command."""

import sys

from .cli import main

sys.exit(main())
