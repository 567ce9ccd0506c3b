import sys

from fixpack.cli.main import main

sys.exit(main())
