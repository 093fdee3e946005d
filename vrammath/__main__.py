"""``python -m vrammath`` runs the CLI."""

import sys

from vrammath.cli import main

sys.exit(main())
