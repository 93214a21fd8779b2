"""What every command shares: error reporting, output helpers, option parsing."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import typer

from planner.errors import PplanError

if TYPE_CHECKING:  # the library's callback type; importing it at run time would load the planner
    from planner.partition.job import StepCallback

__all__ = ["parse_shape", "state", "echo_json", "parse_int_list", "progress", "step_progress", "err", "clock", "eta_text", "timed_say",
           "plan_inputs", "profile_inputs", "at_least", "check_input_file", "check_hardware_input", "check_plan_inputs",
           "check_calibration_input"]


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
    """'1,2,4,8' -> [1, 2, 4, 8], each at least 1, no duplicates; plain ASCII digits ('1_0' and other
    scripts' digits are refused, as in a profile), no empty item ('1,,2' is a typo)."""
    from planner.units import plain_int

    try:
        values = [plain_int(x) for x in text.split(",")]
    except ValueError:
        raise PplanError(f"{what} {text!r} is not a comma-separated list of integers", "write it like 1,2,4,8") from None
    if not values or any(v < 1 for v in values):
        raise PplanError(f"{what} {text!r} needs positive integers", "write it like 1,2,4,8")
    if len(set(values)) != len(values):
        raise PplanError(f"{what} {text!r} has duplicates")
    return values


def clock(seconds: float) -> str:
    """12 -> '12s', 263 -> '4m23s'."""
    seconds = max(0, int(round(seconds)))
    return f"{seconds}s" if seconds < 60 else f"{seconds // 60}m{seconds % 60:02d}s"


def eta_text(elapsed_s: float, done: int, total: int) -> str:
    """'elapsed 40s, about 1m20s left' (remaining extrapolated from the steps done so far)."""
    if done <= 0 or done >= total:
        return f"elapsed {clock(elapsed_s)}"
    return f"elapsed {clock(elapsed_s)}, about {clock(elapsed_s * (total - done) / done)} left"


class progress:
    """A stderr progress bar with elapsed and remaining time.

    On a terminal one line is redrawn; otherwise (logs, pipes) a line is printed at every tenth.
    Remaining time is extrapolated from the steps done so far.
    """

    def __init__(self, total: int, label: str, percent: bool = False):
        self.total, self.label, self.done, self.percent = max(total, 1), label, 0, percent
        self.started = time.monotonic()
        self.tty = sys.stderr.isatty()
        if not self.tty:
            err(f"{label}: " + ("time left weighted by each step's cost" if percent else f"{total} steps"))

    def _count(self) -> str:
        return f"{100 * self.done // self.total}%" if self.percent else f"{self.done}/{self.total}"

    def __enter__(self) -> "progress":
        return self

    def advance(self, note: str = "") -> None:
        self.reach(self.done + 1, note)

    def _show(self, crossed_tenth: bool, note: str) -> None:
        timing = eta_text(time.monotonic() - self.started, self.done, self.total)
        if self.tty:
            width = 30
            filled = int(width * self.done / self.total)
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self._count()} "
                             f"{timing:<30} {note[:40]:<40}")
            sys.stderr.flush()
        elif crossed_tenth:
            err(f"  {self.label}: {self._count()} ({timing}) {note}".rstrip())

    def reach(self, done: int, note: str = "") -> None:
        """Show `done` steps finished (a library's own count); no change when it is not ahead."""
        if done > self.done:
            tenth = max(1, self.total // 10)  # off a terminal, a line each tenth, one however many a jump crosses
            crossed = done >= self.total or done // tenth > self.done // tenth
            self.done = done
            self._show(crossed, note)

    def __exit__(self, *exc: object) -> None:
        if self.tty:
            sys.stderr.write("\n")


@contextmanager
def step_progress(label: str, *, terminal_only: bool = False, percent: bool = False) -> Iterator[StepCallback | None]:
    """An on_step(done, total, note) for library work that counts its own steps (measure_profile,
    partition_pipeline): the bar opens at the first call, sized by the total the work reports, and
    closes when the block ends, error or not. With `terminal_only`, None off a terminal, so logs
    and pipes stay quiet. With `percent`, the count shows as a percent (work reported in units of
    estimated cost, as measure_profile's thousandths are, rather than in steps)."""
    if terminal_only and not sys.stderr.isatty():
        yield None
        return
    bars: list[progress] = []

    def step(done: int, total: int, note: str) -> None:
        if not bars:
            bars.append(progress(total, label, percent))
        bars[0].reach(done, note)

    try:
        yield step
    finally:
        if bars:
            bars[0].__exit__(None, None, None)


_COUNT = re.compile(r"\b(\d+)/(\d+)\b")


def timed_say(label: str) -> Callable[[str], None]:
    """A progress callback for library code that reports in messages: each line gets the elapsed
    time, and the remaining time when the message carries a count such as '3/12'."""
    started = time.monotonic()

    def say(message: str) -> None:
        elapsed = time.monotonic() - started
        found = _COUNT.search(message)
        timing = eta_text(elapsed, int(found[1]) - 1, int(found[2])) if found else f"elapsed {clock(elapsed)}"
        err(f"[{label}] {message} ({timing})")

    return say


def given_params(ctx: typer.Context) -> set[str]:
    """Names of the parameters given on the command line, a flag given at its default value
    included (so that a command can refuse what its mode never reads)."""
    # by the source's name: typer vendors its own click, whose ParameterSource is not click's
    return {p.name for p in ctx.command.params
            if getattr(ctx.get_parameter_source(p.name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")}


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    """`--input-shape '3,32,32'` -> (3, 32, 32): one sample's shape (repeated dimensions are fine)."""
    if text is None:
        return None
    try:
        dims = tuple(int(x) for x in text.replace("x", ",").split(",") if x.strip())
    except ValueError:
        raise PplanError(f"--input-shape {text!r} is not a comma-separated list of integers",
                         "write one sample's shape without the batch dimension, e.g. 3,32,32") from None
    if not dims or any(d < 1 for d in dims):
        raise PplanError(f"--input-shape {text!r} needs positive dimensions",
                         "one sample's shape without the batch dimension: e.g. 128 (tokens) or 3,32,32 (an image)")
    return dims


def profile_inputs(profile: Optional[Path], calibration: Optional[str] = None,
                   hardware: Optional[str] = None) -> list[tuple[str, Optional[Path]]]:
    """(what, path) of the files a command pricing `profile` reads besides it, for
    planner.atomic.ensure_outputs_distinct: the calibration (--calibration, else the profile's
    own when it exists) and --hardware when it names a file rather than a preset."""
    from planner.calibration import calibration_path_for

    if calibration is None:
        own = calibration_path_for(profile) if profile is not None else None
        cal = own if own is not None and own.exists() else None
    else:
        cal = None if calibration.strip().lower() == "none" else Path(calibration)
    hw = Path(hardware) if hardware is not None and Path(hardware).is_file() else None
    return [("profile", profile), ("calibration", cal), ("hardware file", hw)]


def plan_inputs(plan_path: Path, profile: Optional[Path], calibration: Optional[str] = None,
                hardware: Optional[str] = None) -> list[tuple[str, Optional[Path]]]:
    """(what, path) of every file a command reading the plan at `plan_path` reads: the plan, its
    profile (--profile, else the one the plan names) and what profile_inputs lists. Loads the plan
    (milliseconds), so a bad plan fails here with the message it would give later."""
    from planner.plan import load_plan, resolve_profile_path

    plan = load_plan(plan_path)
    prof = resolve_profile_path(plan, str(plan_path), str(profile) if profile is not None else None)
    return [("plan", plan_path), *profile_inputs(prof, calibration, hardware)]


def at_least(flag: str, value: int | None, least: int, hint: str) -> None:
    """Refuse `flag`'s integer `value` below `least` (None: not given) with `hint`, before the
    library, whose own check names the bound but not what to give."""
    if value is not None and value < least:
        raise PplanError(f"{flag} {value} must be at least {least}", hint)


_SCANNED_ENTRIES = 1000
"""Entries of a folder given for a file that are looked at for files to suggest: a folder of
profiles or plans holds tens. Measured: 0.5 ms for the first 1,000 of a 20,001-entry folder, 9.6
ms for all of it; a folder of millions (a home or /tmp) would hold the error up for seconds."""
_SNIFFED_FILES = 32
"""Files with the right extension whose first bytes are read to tell their kind (a demo.json is no
plan): a few dozen covers a folder of outputs (reports/example/data holds 9 JSON files), and reading
4 KiB of each is bounded however many the folder holds."""


def _files_in(folder: Path, suffix: str) -> tuple[list[str], bool | None]:
    """(the names in `folder` ending in `suffix` among its first _SCANNED_ENTRIES entries, sorted;
    whether that was all of them, None when it cannot be listed)."""
    names = []
    try:
        with os.scandir(folder) as entries:
            for i, entry in enumerate(entries):
                if i >= _SCANNED_ENTRIES:
                    return sorted(names), False
                if entry.name.lower().endswith(suffix) and entry.is_file():
                    names.append(entry.name)
    except OSError:
        return [], None
    return sorted(names), True


def _head(path: Path) -> bytes:
    """The first SNIFF_BYTES of the regular file `path`; b"" for anything else (a FIFO, a device, a
    folder, a file that cannot be read): planner.jsonio.open_regular never waits for a FIFO."""
    from planner.filekind import SNIFF_BYTES
    from planner.jsonio import open_regular

    try:
        opened = open_regular(path)
        if opened is None:
            return b""
        with opened[0] as fh:
            return fh.read(SNIFF_BYTES)
    except (OSError, ValueError):
        return b""


def _is_kind(path: Path, kind: str) -> bool:
    """Whether `path` is a pplan file of `kind` by its first bytes (planner.filekind.head_kind)."""
    from planner.filekind import head_kind

    return (head_kind(_head(path)) or ("",))[0] == kind


_CSV_KINDS = ("profile", "timeline")


def _files_of_kind(folder: Path, kind: str) -> tuple[list[str], bool | None]:
    """(names of the files in `folder` that are of `kind` by their first bytes, the likeliest first;
    whether every candidate was read, None when the folder cannot be listed). Candidates have the
    kind's extension; those named for it (plan*.json for a plan) are read first."""
    names, complete = _files_in(folder, ".csv" if kind in _CSV_KINDS else ".json")
    names.sort(key=lambda name: (kind not in name.lower(), name))
    found = [name for name in names[:_SNIFFED_FILES] if _is_kind(folder / name, kind)]
    return found, None if complete is None else complete and len(names) <= _SNIFFED_FILES


def _is_folder(path: Path) -> bool:
    """Whether `path` is a folder; False where it cannot be looked at (no permission, a NUL in the
    name): the library's reader then says why in its own words."""
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def _named_anything(path: Path) -> bool:
    """Whether something (a broken link too) is at `path`; True where it cannot be looked at."""
    try:
        return os.path.lexists(path)
    except (OSError, ValueError):
        return True


def _folder_hint(folder: Path, kind: str, make: Optional[str]) -> str:
    """What to give instead of `folder`: a file of `kind` in it, else `make` or its path."""
    from planner.filekind import FILE_KINDS

    words = FILE_KINDS[kind][0]
    found, complete = _files_of_kind(folder, kind)
    if found:
        more = f" (one of its {len(found)}{'' if complete else '+'} {words}s)" if len(found) > 1 else ""
        return f"give a file, e.g. {str(folder / found[0])!r}{more}"
    instead = make or f"give the path of a {words}"
    if complete is None:  # cannot be listed: nothing to say about what it holds
        return instead
    held = f"this folder holds no {words}" if complete else f"no {words} among the files of this folder looked at"
    return f"{held}; {instead}"


def check_input_file(path: Optional[Path], what: str, kind: str, *, make: Optional[str] = None,
                     error: type[PplanError] = PplanError) -> None:
    """Refuse an input `path` (None: not given) that is a folder, with a hint naming a file of `kind`
    (a planner.filekind.FILE_KINDS kind) in it; with `make` (how to get such a file), also one
    that does not exist. The messages are the library readers' (planner.jsonio), which read the file
    later and say no more than that."""
    if path is None:
        return
    if _is_folder(path):
        raise error(f"{what} {str(path)!r} is a directory, not a file", _folder_hint(path, kind, make))
    if make is not None and not _named_anything(path):
        raise error(f"{what} {str(path)!r} does not exist", make)


def check_plan_inputs(plan: Optional[Path], profile: Optional[Path]) -> None:
    """Refuse, with what to give instead, a folder given for the plan or the profile (None: not given)."""
    from planner.errors import PlanError, ProfileError

    check_input_file(plan, "plan", "plan", error=PlanError)
    check_input_file(profile, "profile", "profile", error=ProfileError)


def check_calibration_input(calibration: Optional[str]) -> None:
    """Refuse a folder given for --calibration (None: not given; 'none': no calibration)."""
    if calibration is not None and calibration.strip().lower() != "none":
        check_input_file(Path(calibration), "calibration", "calibration")


def check_hardware_input(value: Optional[str]) -> None:
    """--hardware (None: not given) that names a folder or a missing JSON file rather than a preset."""
    if value is None or not value.strip():  # empty: load_hardware names it so
        return
    from planner.errors import ClusterError
    from planner.hardware import PRESETS

    if value in PRESETS:
        return
    looks_like_file = value.lower().endswith(".json") or "/" in value or os.sep in value
    make = (f"give a preset ({', '.join(PRESETS)}) or an existing hardware JSON; "
            "`pplan hardware a100-80gb --json > my.json` starts one")
    # a name that is no file may be a preset misspelled: load_hardware suggests the nearest
    check_input_file(Path(value), "hardware file", "hardware", error=ClusterError,
                     make=make if looks_like_file or _is_folder(Path(value)) else None)
