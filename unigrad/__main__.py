"""``python -m unigrad``: the same command as the ``unigrad`` console script."""

import sys

from ._cli import main

sys.exit(main())
