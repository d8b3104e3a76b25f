"""One error family whose members carry the exit code of the CLI contract.

Why: a builder runs unattended in Makefiles and nightly jobs, so every failure a
user can fix must end as one line that names the file, the field and the fix,
with the documented exit code, while a bug keeps its traceback.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_ACCURACY = 1
EXIT_USAGE = 2
EXIT_BACKEND = 3


class TrtbuildError(Exception):
    """A failure the user can act on; `cli.main` prints it as one message."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.where = where
        self.hint = hint

    def __str__(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        if self.hint:
            text += f" ({self.hint})"
        return text


class UsageError(TrtbuildError):
    """Bad command line, policy, model or data: exit 2."""

    exit_code = EXIT_USAGE


class BackendError(TrtbuildError):
    """Backend missing or engine build failed: exit 3."""

    exit_code = EXIT_BACKEND
