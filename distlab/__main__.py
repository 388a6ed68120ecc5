"""`python -m distlab`: the `distlab` command."""

import sys

from distlab import main

sys.exit(main())
