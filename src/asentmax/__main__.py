"""`python -m asentmax` runs the command line (asentmax.cli)."""

import sys

from asentmax.cli import main

sys.exit(main())
