"""One error family for everything a user can cause.

Library code raises these with the values involved and a hint; only `cli/` turns them into
an exit code and a one-line message.
"""

from __future__ import annotations

__all__ = [
    "PplanError",
    "ProfileError",
    "PlanError",
    "ModelSpecError",
    "ModelTooLargeError",
    "ScheduleError",
    "InfeasibleError",
    "ClusterError",
    "RunError",
]


class PplanError(Exception):
    """Base class: a problem the user can fix. `hint` is appended to the message."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        self.message = message
        self.hint = hint
        super().__init__(self.one_line())

    def one_line(self) -> str:
        text = self.message if not self.hint else f"{self.message}; {self.hint}"
        return " ".join(text.split())


class ProfileError(PplanError):
    """A profile CSV that is missing, malformed or inconsistent."""


class PlanError(PplanError):
    """A plan JSON that is malformed or does not match its model or profile."""


class ModelSpecError(PplanError):
    """A `--model` string that names no model or has bad parameters."""


class ModelTooLargeError(ModelSpecError):
    """A model whose weights and one sample's activations exceed what this machine can build."""


class ScheduleError(PplanError):
    """An unknown schedule, or sizes the schedule cannot run."""


class InfeasibleError(PplanError):
    """No plan fits the memory limits at these settings."""


class ClusterError(PplanError):
    """A cluster description that does not parse or is inconsistent."""


class RunError(PplanError):
    """The executor failed: a rank died, timed out or could not start."""

    exit_code = 1
