"""User-facing errors shared by host and device.

Every error a user can cause ends as one line on stderr that names the problem and the fix, with exit
code 2 (the CLI maps these; ``--debug`` shows the traceback).
"""

from __future__ import annotations


class QuarlError(Exception):
    """A problem the user can fix. ``str()`` is the one line the CLI prints."""

    exit_code = 2

    def __init__(self, problem: str, fix: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.problem}; {self.fix}" if self.fix else self.problem


class InputError(QuarlError):
    """A file, flag or value that cannot be used as given."""


class IntegrityError(QuarlError):
    """A file whose content does not match its recorded sha256, or is corrupt."""


class MissingDependencyError(QuarlError):
    """An optional part is not installed; the message carries the exact install command."""


class Interrupted(QuarlError):
    """Ctrl-C: exit 130, with what was kept and how to go on."""

    exit_code = 130
