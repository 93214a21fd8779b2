"""The `pplan` console script (pyproject.toml): imports the command line, then runs it.

Importing cli.app (typer, numpy and every command's module) takes a tenth of a second or more;
a Ctrl-C in that time would end in a KeyboardInterrupt traceback, since the handling in
cli.app.main is not loaded yet. This module imports nothing heavy, so that it can catch it.
"""

from __future__ import annotations

from cli import exit_stopped


def main() -> None:
    """Console-script entry: cli.app.main, with a Ctrl-C during its import leaving as one line."""
    try:
        from cli.app import main as run_command_line
    except KeyboardInterrupt:
        exit_stopped()
    run_command_line()


if __name__ == "__main__":
    main()
