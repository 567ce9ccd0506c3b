import sys

from fixpack.main import main

sys.exit(main())
