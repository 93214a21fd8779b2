"""Entry point of `pplan`: builds the typer app from one module per command.

Errors a user can cause arrive as PplanError and leave as one line on stderr with exit code 2
(no traceback unless --debug or PPLAN_DEBUG=1).
"""

from __future__ import annotations

import importlib
import sys

import typer

from cli.common import state
from planner.errors import PplanError

# One module per command, each defining `register(app)`; order = order in `pplan --help`.
COMMANDS = ["profile", "partition", "simulate", "run", "calibrate", "report", "demo", "bench"]

app = typer.Typer(
    name="pplan",
    help="Plan, simulate and run pipeline-parallel training of PyTorch models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks instead of one-line errors."),
) -> None:
    """pplan: profile a model, partition it into pipeline stages, simulate, run and report."""
    if debug:
        state.debug = True


for _name in COMMANDS:
    try:
        _module = importlib.import_module(f"cli.cmd_{_name}")
    except ModuleNotFoundError as _e:  # a command still being written on this branch
        if _e.name != f"cli.cmd_{_name}":
            raise
        continue
    _module.register(app)


def _interrupt_of(exit_exc: SystemExit) -> KeyboardInterrupt | None:
    """The Ctrl-C behind a SystemExit, if any: typer turns KeyboardInterrupt into a silent
    exit 130 (SystemExit <- typer Exit <- KeyboardInterrupt), so look down the chain."""
    seen = exit_exc.__context__
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def main() -> None:
    """Console-script entry: run the app, turning user errors into exit code 2."""
    if "--debug" in sys.argv[1:]:
        state.debug = True
    try:
        app()
    except PplanError as e:
        if state.debug:
            raise
        sys.stderr.write(f"pplan: error: {e.one_line()}\n")
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        if state.debug:
            raise
        sys.stderr.write("pplan: interrupted\n")
        sys.exit(130)
    except SystemExit as e:
        interrupt = _interrupt_of(e)
        if interrupt is None:
            raise
        if state.debug:
            raise interrupt from None
        sys.stderr.write("pplan: interrupted\n")
        sys.exit(130)


if __name__ == "__main__":
    main()
