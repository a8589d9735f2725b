"""``python -m aiofragno``: the ``aiofragno`` command."""

import sys

from .cli import main

sys.exit(main())
