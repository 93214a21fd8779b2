"""The `pplan` command line: thin typer commands over the `planner` library.

Loaded first, before the commands import (cli/entry.py): what must work while the rest is still
importing lives here, so it imports only sys and signal.
"""

from __future__ import annotations

import signal
import sys


def exit_stopped(signum: int = signal.SIGINT) -> None:
    """Leave as a command stopped by `signum`: one line on stderr and exit 128 + signal, as a shell
    reports a command the signal ended (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP). Nothing
    half-written stays: outputs are written atomically and their temporary files removed on the way out."""
    sys.stderr.write("pplan: interrupted\n" if signum == signal.SIGINT else "pplan: terminated\n")
    sys.exit(128 + signum)
