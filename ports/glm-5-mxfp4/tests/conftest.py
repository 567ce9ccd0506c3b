import sys
from pathlib import Path

PORT_ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
for p in (PORT_ROOT, TESTS):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
