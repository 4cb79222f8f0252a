"""``python -m dvasim.cli``: the same command line as ``dvasim``."""

import sys

from dvasim.cli import main

sys.exit(main())
