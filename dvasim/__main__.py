"""python -m dvasim: the command line."""

import sys

from dvasim.cli import main

sys.exit(main())
