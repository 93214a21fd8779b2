"""Running the real `pplan` CLI: in this process (the conftest `pplan` fixture), or as a real
process where a test needs one (signals, exit without a traceback, start-up imports, torchrun)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"

JOB_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PPLAN_DEBUG")
"""Variables a developer's shell or a torchrun job may set that change what a command does."""


def run_in_process(monkeypatch: Any, capsys: Any, *args: object) -> tuple[int, str, str]:
    """Run `cli.app.main` with `args` in this process: (exit code, stdout, stderr)."""
    from cli.app import main
    from cli.common import state

    monkeypatch.setattr(sys, "argv", ["pplan", *map(str, args)])
    monkeypatch.setattr(state, "debug", False)  # `--debug` sets a global: one run must not leak into the next
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out = capsys.readouterr()
    return code, out.out, out.err


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for a `pplan` subprocess: this one without job variables, with the
    repository (and tests/, for test models such as `dropout_model:build`) importable."""
    env = {k: v for k, v in os.environ.items() if k not in JOB_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(extra)
    return env


def pplan_command(*args: object) -> list[str]:
    return [sys.executable, "-m", "cli.app", *map(str, args)]


def run_pplan(*args: object, cwd: Path | None = None, timeout: float = 300, env: dict[str, str] | None = None,
              **extra_env: str) -> subprocess.CompletedProcess:
    """Run `python -m cli.app ARGS` in a subprocess, as a user would, capturing text output.
    `env` replaces the environment entirely; `extra_env` adds to `cli_env()`."""
    return subprocess.run(pplan_command(*args), cwd=cwd or REPO, env=env if env is not None else cli_env(**extra_env),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def start_pplan(*args: object, cwd: Path | None = None, **popen: Any) -> subprocess.Popen:
    """Start `python -m cli.app ARGS` without waiting (for tests that signal or watch it);
    `popen` goes to subprocess.Popen (env defaults to `cli_env()`)."""
    popen.setdefault("env", cli_env())
    popen.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen(pplan_command(*args), cwd=cwd or REPO, **popen)
