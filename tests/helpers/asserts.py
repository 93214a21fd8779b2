"""Assertions several test modules make."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest


def assert_file_refused(load: Callable[[Path], Any], path: Path, text: str, error: type[BaseException], match: str) -> None:
    """`load` refuses `path` holding `text`: it raises `error` with a message matching `match`."""
    path.write_text(text)
    with pytest.raises(error, match=match):
        load(path)
