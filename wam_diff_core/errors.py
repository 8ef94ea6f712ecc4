"""The base class of every error a user can cause: a wrong path, a bad key, a corrupt file, a bad value.

Its message stands alone on one line: what is wrong, where (the file, key or flag), and what was expected.
Console scripts print it as `<command>: error: <message>` and exit 2 (wam_diff_core/console.py); any
other exception is a bug and keeps its traceback.

Subclasses keep a built-in base as well (`class CheckpointError(WamDiffError, ValueError)`), so code
that catches ValueError or RuntimeError still catches them.
"""
from __future__ import annotations


class WamDiffError(Exception):
    """A user's mistake or bad input; the message names the bad value and what was expected."""


class UsageError(WamDiffError, ValueError):
    """A command-line value that does not spell what its flag expects."""
