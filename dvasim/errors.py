"""Errors a user can fix: each names the field at fault and what is allowed.

The CLI prints them as one line and exits with status 2, without a traceback.
"""

from __future__ import annotations

import argparse


class DvasimError(Exception):
    """Base class for user-facing errors (bad config, bad table, bad input)."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(field, message)  # args kept as (field, message) so the error can be re-created

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class ConfigError(DvasimError):
    """A config value is unknown, missing, of the wrong type or out of range."""


class TableError(DvasimError):
    """A latency table is missing, malformed, or asked for a point outside its profiled range."""


class WorkloadError(DvasimError):
    """A workload (arrivals, input sizes) is invalid."""


class OutputError(DvasimError):
    """An output file could not be written (a full disk, a read-only folder); nothing half-written is left."""


class IncompleteRunWarning(RuntimeWarning):
    """A simulation ended with queries that never finished (the result's ``stuck`` says where they waited)."""


class UsageError(DvasimError):
    """A command-line argument is missing, unknown or malformed."""


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (a :class:`UsageError` naming the flag), not usage + message."""

    def error(self, message):
        field = "arguments"
        for word in str(message).replace(",", " ").split():
            if word.startswith("-"):
                field = word.rstrip(":")
                break
        raise UsageError(field, f"{message} (see {self.prog} -h)")


def check_out_dir(path, field: str = "--out") -> None:
    """Refuse an output directory that cannot be made or written, before any work starts."""
    import os
    from pathlib import Path

    if str(path).strip() == "":
        raise UsageError(field, "is empty; give a directory path")
    p = Path(path)
    try:
        if p.exists() and not p.is_dir():
            raise UsageError(field, f"{str(p)!r} exists and is not a directory; give a directory path")
        probe = p
        while not probe.exists():
            probe = probe.parent
    except OSError as e:  # a name too long for the file system
        raise UsageError(field, f"{str(p)[:200]!r}...: {e.strerror or e}; give a shorter path") from None
    if not probe.is_dir():
        raise UsageError(field, f"{str(probe)!r} is a file, so {str(p)!r} cannot be a directory; give another path")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(field, f"{str(probe)!r} is not writable; give a directory you can write to")
