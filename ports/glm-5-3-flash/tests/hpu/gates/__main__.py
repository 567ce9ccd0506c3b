"""`python -m gates` (from ports/glm-5-3-flash/tests/hpu, or with it on PYTHONPATH): every gate."""

import sys

from .driver import main

sys.exit(main())
