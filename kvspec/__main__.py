"""``python -m kvspec`` is the ``kvspec`` command."""

import sys

from kvspec.cli import main

sys.exit(main())
