"""User-facing errors shared by host and device.

Every error a user can cause ends as one line on stderr that names the problem and the fix, with exit
code 2 (the CLI maps these; ``--debug`` shows the traceback).
"""

from __future__ import annotations


class QuarlError(Exception):
    """A problem the user can fix. ``str()`` is the one line for a Python caller; :meth:`cli_text` the one
    the CLI prints: the same problem with ``cli_fix``, the fix in command-line flags, when the fix differs
    between the two (``model='x'`` in Python is ``--model x`` on the command line)."""

    exit_code = 2

    def __init__(self, problem: str, fix: str | None = None, *, cli_fix: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix
        self.cli_fix = cli_fix

    def __str__(self) -> str:
        return f"{self.problem}; {self.fix}" if self.fix else self.problem

    def cli_text(self) -> str:
        fix = self.cli_fix or self.fix
        return f"{self.problem}; {fix}" if fix else self.problem


class InputError(QuarlError):
    """A file, flag or value that cannot be used as given."""


class IntegrityError(QuarlError):
    """A file whose content does not match its recorded sha256, or is corrupt."""


class MissingDependencyError(QuarlError):
    """An optional part is not installed; the message carries the exact install command."""


class Interrupted(QuarlError):
    """Ctrl-C: exit 130, with what was kept and how to go on."""

    exit_code = 130
