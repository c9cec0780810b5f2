"""The operator-facing errors of foxhunt_ops (kept apart so the CLI imports them cheaply)."""

from __future__ import annotations


class PlanError(ValueError):
    """A plan is invalid; ``problems`` (and ``str()``) are one line each: ``file:line: path: message``."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class LedgerError(RuntimeError):
    """The ledger is missing or from another schema, or a state change is not allowed."""
