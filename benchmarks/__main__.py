"""``python -m benchmarks``: see benchmarks/README.md."""

import sys

from .run import main

sys.exit(main())
