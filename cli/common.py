"""What every command shares: error reporting, output helpers, option parsing."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import typer

from planner.errors import PplanError

__all__ = ["state", "echo_json", "parse_int_list", "progress", "err"]


class _State:
    """Global flags set by the top-level callback."""

    debug: bool = os.environ.get("PPLAN_DEBUG", "") not in ("", "0")


state = _State()


def err(message: str) -> None:
    """Print to stderr (progress, warnings), never to stdout (which may be --json)."""
    typer.echo(message, err=True)


def echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, allow_nan=False))


def parse_int_list(text: str, what: str) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8], each at least 1, no duplicates."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PplanError(f"{what} {text!r} is not a comma-separated list of integers", "write it like 1,2,4,8") from None
    if not values or any(v < 1 for v in values):
        raise PplanError(f"{what} {text!r} needs positive integers", "write it like 1,2,4,8")
    if len(set(values)) != len(values):
        raise PplanError(f"{what} {text!r} has duplicates")
    return values


class progress:
    """A minimal stderr progress bar that stays quiet when stderr is not a terminal."""

    def __init__(self, total: int, label: str):
        self.total, self.label, self.done = max(total, 1), label, 0
        self.tty = sys.stderr.isatty()
        if not self.tty:
            err(f"{label}: {total} steps")

    def __enter__(self) -> "progress":
        return self

    def advance(self, note: str = "") -> None:
        self.done += 1
        if self.tty:
            width = 30
            filled = int(width * self.done / self.total)
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {note[:40]:<40}")
            sys.stderr.flush()
        elif self.done == self.total or self.done % max(1, self.total // 10) == 0:
            err(f"  {self.label}: {self.done}/{self.total} {note}")

    def __exit__(self, *exc: object) -> None:
        if self.tty:
            sys.stderr.write("\n")
