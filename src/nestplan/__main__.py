"""``python -m nestplan ...``: the same command as the ``nestplan`` console script."""

import sys

from .cli import main

sys.exit(main())
