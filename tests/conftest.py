"""Shared fixtures: one in-process runner of the real `pplan` entry point."""

from __future__ import annotations

import sys
from typing import Callable

import pytest


@pytest.fixture
def pplan(monkeypatch, capsys) -> Callable[..., tuple[int, str, str]]:
    """pplan(*args) -> (exit code, stdout, stderr), running cli.app.main in this process."""
    from cli.app import main

    def run(*args: object) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["pplan", *map(str, args)])
        code = 0
        try:
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        out = capsys.readouterr()
        return code, out.out, out.err

    return run
