"""Makes the example application importable from its tests (a project has its own way)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
