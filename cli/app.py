"""Entry point of `pplan`: builds the typer app from one module per command.

Errors a user can cause arrive as PplanError and leave as one line on stderr with exit code 2
(no traceback unless --debug or PPLAN_DEBUG=1). With --json anywhere on the command line, the
same errors (and usage errors) are printed as JSON on stdout, `{"error": "...", "hint": "..."}`,
with the same exit code, so a script reads them where it reads results. A signal asking the
command to stop (Ctrl-C, SIGTERM, SIGHUP) unwinds it like an error, removing temporary files, and
leaves as one line, `pplan: interrupted` (exit 130) or `pplan: terminated` (128 + signal).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
import threading
from typing import Annotated, Iterator

import typer

from cli import exit_stopped
from cli.common import state
from planner.errors import PplanError
from planner.textsafe import MAX_MESSAGE_CHARS, printable

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


def _show_version(value: bool) -> None:
    if value:
        from planner import __version__

        typer.echo(f"pplan {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks instead of one-line errors.")] = False,
    version: Annotated[bool, typer.Option(
        "--version", callback=_show_version, is_eager=True, help="Print pplan's version and exit.")] = False,
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


class _Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the interpreter is, as Ctrl-C raises KeyboardInterrupt: a
    subclass, so that whatever stops cleanly on a Ctrl-C (typer, the `finally` blocks that remove
    temporary files and stop worker processes) does the same for these."""


class _Stop:
    """Which signal asking this command to stop (SIGINT: Ctrl-C; SIGTERM: kill's default; SIGHUP: a
    closed terminal) reached it, if any. Python raises a Ctrl-C as KeyboardInterrupt wherever the
    interpreter is, and C code that calls back into Python may report it as an error of its own
    (numpy's comparison of structured arrays, inside np.unique, turns it into a TypeError): after a
    stop signal, whatever exception ends the command is the stop."""

    seen: int | None = None

    @staticmethod
    def _note(signum: int, frame: object) -> None:
        if signum != signal.SIGINT and _Stop.seen is not None:
            return  # already unwinding: let the cleanup finish, as `pplan run` does
        _Stop.seen = _Stop.seen or signum
        if signum == signal.SIGINT:
            signal.default_int_handler(signum, frame)
        raise _Terminated(signum)

    @staticmethod
    def _watched_signals() -> dict[int, object]:
        """Each signal to watch, with the handler it has when nobody changed it: only a signal that
        would act as its default is taken over (a SIGINT or SIGHUP ignored, as by a shell's
        background job or nohup, stays ignored). SIGTERM and SIGHUP are left alone in a rank of a
        torchrun (or other) job, RANK and WORLD_SIZE set: its launcher stops it with SIGTERM and
        expects it gone at once, also while it waits inside a collective, in C code where no Python
        handler runs. `pplan run` sets its own for the time its ranks run (planner/execute/run.py)."""
        watched: dict[int, object] = {signal.SIGINT: signal.default_int_handler}
        if not ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
            watched.update({sig: signal.SIG_DFL for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if sig})
        return watched

    @staticmethod
    @contextlib.contextmanager
    def watched() -> Iterator[None]:
        """Note stop signals while the command runs (on the main thread, where handlers can be set;
        see _watched_signals for which); the handlers before are restored after."""
        _Stop.seen = None
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        with contextlib.ExitStack() as restore:
            for sig, default in _Stop._watched_signals().items():
                if signal.getsignal(sig) == default:
                    restore.callback(signal.signal, sig, default)
                    signal.signal(sig, _Stop._note)
            yield


def _stopped() -> None:
    """Leave as a stopped command: one line, exit 128 + signal (the signal seen, else a Ctrl-C)."""
    exit_stopped(_Stop.seen or signal.SIGINT)


def _wants_json(argv: list[str]) -> bool:
    """--json among the options (before a `--` that ends them)."""
    args = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in args


def _fail(message: str, hint: str | None, code: int, as_json: bool) -> None:
    """Leave with `code`: one line on stderr, or {"error", "hint"} on stdout under --json.

    The message may quote a file's contents (a name, a line), so it is made printable: control
    characters escaped and its middle cut past MAX_MESSAGE_CHARS (planner/textsafe.py)."""
    message = printable(message)
    hint = printable(hint, MAX_MESSAGE_CHARS // 2) if hint else hint
    if as_json:
        sys.stdout.write(json.dumps({"error": message, "hint": hint}) + "\n")
        sys.stdout.flush()
    else:
        text = message if not hint else f"{message.removesuffix('.')}; {hint}"
        sys.stderr.write(f"pplan: error: {text}\n")
    sys.exit(code)


def _usage_hint(error: Exception) -> str:
    """Where to look after a usage error: the own --help of the deepest command invoked."""
    ctx = getattr(error, "ctx", None)
    path = getattr(ctx, "command_path", None) or _invoked_path(sys.argv[1:])
    return f"see `{path} --help`"


def _usage_message(error: Exception) -> str:
    """click's message, with what it leaves out: the value a bad option got (typer's conversion
    errors name the option and the type, not the text typed), and where a root option belongs."""
    message = error.format_message()  # type: ignore[attr-defined]
    opts = getattr(getattr(error, "param", None), "opts", None) or []
    given = _value_of(sys.argv[1:], opts) if type(error).__name__ == "BadParameter" else None
    if given is not None:
        message = f"{message.removesuffix('.')} (got {given[:60]!r})"
    root = getattr(error, "option_name", None)
    if type(error).__name__ == "NoSuchOption" and root in ("--debug", "--version"):
        command = " ".join(_invoked_path(sys.argv[1:]).split()[1:])
        message += f" here: it goes before the command, e.g. `pplan {root} {command} ...`"
    return message


def _value_of(argv: list[str], opts: list[str]) -> str | None:
    """The text given to one of `opts` in `argv` (`--opt value` or `--opt=value`), the last one; None if absent."""
    found = None
    for i, word in enumerate(argv):
        name, eq, value = word.partition("=")
        if name in opts:
            found = value if eq else argv[i + 1] if i + 1 < len(argv) else None
    return found


def _invoked_path(argv: list[str]) -> str:
    """`pplan` and the (sub)command names `argv` invokes. Click raises some usage errors without
    the failing command's context (a missing option value: `pplan profile -m`), whose hint then
    named `pplan --help`; the command tree says how deep the words go."""
    command, path = typer.main.get_command(app), ["pplan"]
    for word in argv:
        if word.startswith("-"):
            continue  # an option (root options such as --debug come before the command)
        sub = (getattr(command, "commands", None) or {}).get(word)
        if sub is None:
            break
        command, path = sub, [*path, word]
    return " ".join(path)


def _run_app(as_json: bool) -> None:
    """Run with click's own error printing off, so a usage error (unknown option, missing or
    malformed value, unknown command) leaves as one line like every other error, or as JSON."""
    try:  # typer >= 0.29 vendors click as typer._click; earlier versions use click itself
        from typer._click.exceptions import ClickException, NoArgsIsHelpError
    except ImportError:  # pragma: no cover - depends on the installed typer
        from click.exceptions import ClickException, NoArgsIsHelpError

    try:
        result = app(standalone_mode=False, prog_name="pplan")
    except (typer.Abort, KeyboardInterrupt):
        raise KeyboardInterrupt from None
    except NoArgsIsHelpError as e:
        if as_json:
            _fail("no command given", _usage_hint(e), e.exit_code, True)
        e.show()  # `pplan` or a group alone: the help is the answer, as click prints it
        sys.exit(e.exit_code)
    except ClickException as e:
        _fail(_usage_message(e), _usage_hint(e), e.exit_code, as_json)
    else:
        if isinstance(result, int) and result:  # click returns an Exit's code instead of raising
            sys.exit(result)


def main() -> None:
    """Console-script entry: run the app, turning user errors into exit code 2."""
    if "--debug" in sys.argv[1:]:
        state.debug = True
    as_json = _wants_json(sys.argv[1:])
    try:
        with _Stop.watched():
            _run_app(as_json)
    except KeyboardInterrupt:
        if state.debug:
            raise
        _stopped()
    except SystemExit as e:
        interrupt = _interrupt_of(e)
        if interrupt is None and not (_Stop.seen and e.code):  # a failure after a stop signal is the stop
            raise
        if state.debug:
            raise (interrupt or e) from None
        _stopped()
    except Exception as e:
        if state.debug:
            raise
        if _Stop.seen:  # whatever error a stop signal became on its way out (_Stop)
            _stopped()
        if not isinstance(e, PplanError):
            raise
        _fail(e.message, e.hint, e.exit_code, as_json)


if __name__ == "__main__":
    main()
