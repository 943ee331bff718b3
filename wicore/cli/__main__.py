"""`python -m wicore.cli ...` runs the `wicore` command."""

import sys

from wicore.cli.main import main

sys.exit(main())
