"""Errors a user can fix: each names the field at fault and what is allowed.

The CLI prints them as one line and exits with status 2, without a traceback.
"""

from __future__ import annotations


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


class IncompleteRunWarning(RuntimeWarning):
    """A simulation ended with queries that never finished (the result's ``stuck`` says where they waited)."""
