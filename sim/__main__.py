"""``python -m sim`` runs the simulated cluster (see ``python -m sim run --help``)."""

import sys

from sim.cli import main

sys.exit(main())
