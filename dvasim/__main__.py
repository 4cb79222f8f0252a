"""python -m dvasim: the command line."""

from dvasim.cli import entry

entry()
