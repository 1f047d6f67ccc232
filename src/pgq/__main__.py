"""``python -m pgq``: the ``pgq`` command, also where another package's script took the name."""

import sys

from pgq._cli import main

sys.exit(main())
