"""``python -m field.report``: write docs/field-report.md and .json (see the package)."""

import sys

from field.report import main

sys.exit(main())
