"""`python -m shapescript ...`: the same command line as `shapescript ...`."""

import sys

from shapescript.cli import main

sys.exit(main())
