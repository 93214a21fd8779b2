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
COMMANDS = ["profile", "partition", "simulate", "run", "calibrate", "report", "demo", "bench", "hardware"]

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


# One line each in `pplan --help` (click would cut the docstrings at 45 characters).
SHORT_HELP = {
    "profile": "Measure per-layer time and memory of a model -> profile CSV.",
    "partition": "Choose cuts, micro-batches, recompute and schedule -> plan JSON.",
    "simulate": "Predict iteration time, bubble and memory of a plan.",
    "run": "Train a plan on torch pipelining; measured vs predicted.",
    "calibrate": "Run a plan and fit what the profile cannot see.",
    "report": "Write figures and an HTML/Markdown report under reports/NAME/.",
    "demo": "Profile, plan, simulate, run, calibrate and report a gpt, on CPU.",
    "bench": "Benchmarks: planner and simulator speed, plan quality, fidelity.",
    "hardware": "Hardware presets (FLOP/s, memory, links), or one device in full.",
}

for _name in COMMANDS:
    importlib.import_module(f"cli.cmd_{_name}").register(app)
for _info in app.registered_commands:
    _cmd_name = _info.name or (_info.callback.__name__ if _info.callback else None)
    if _cmd_name in SHORT_HELP and not _info.short_help:
        _info.short_help = SHORT_HELP[_cmd_name]
for _group in app.registered_groups:  # subcommand groups such as `bench`
    if _group.name in SHORT_HELP:
        _group.short_help = SHORT_HELP[_group.name]


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
