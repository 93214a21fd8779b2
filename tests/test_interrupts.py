"""Stopping a command at any point leaves the old outputs or the complete new ones, nothing between.

A report's swap of figures/ and its index holds Ctrl-C, SIGTERM and SIGHUP until it is done; a
report removes the staging folders a killed one left. SIGTERM and SIGHUP unwind any command as
Ctrl-C does (temporary files removed, one line, exit 128 + signal); a Ctrl-C while the command
line is still importing is one line too. Processes are synchronised on what they print or write,
never on time.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from helpers.cli import REPO, cli_env, one_error_line
from planner.errors import PplanError
from planner.report.document import FigureEntry, ReportDocument, render_html, render_markdown, write_report_folder

DATA = Path(__file__).parent / "data"


# ---- the report folder: swapped as a whole, leftovers removed ----------------------------------

def _write(out: Path, version: str) -> None:
    """A small report whose figure and index both say `version`."""
    figures = {"1_schedule.png": version.encode()}
    entries = (FigureEntry(1, "1_schedule", "t", "c", ("figures/1_schedule.png",)),)
    doc = ReportDocument(title=version, inputs=(("plan", "plan.json"),), summary=(), figures=entries)
    write_report_folder(out, figures, render_markdown(doc), render_html(doc))


def _versions(out: Path) -> set[str]:
    """Which report each part of the folder belongs to (one element when they agree)."""
    return {(out / "figures" / "1_schedule.png").read_text(), (out / "report.md").read_text().splitlines()[0][2:],
            (out / "report.html").read_text().split("<title>")[1].split("</title>")[0]}


@pytest.mark.parametrize("previous", [True, False], ids=["over-a-report", "fresh-folder"])
@pytest.mark.parametrize("after_rename", [1, 2, 3, 4])
def test_a_ctrl_c_during_the_swap_lands_after_it(tmp_path, monkeypatch, previous, after_rename):
    """Ctrl-C right after the n-th rename of the swap: before the fix, the old index stayed beside
    the new figures (or figures/ alone in a fresh folder)."""
    out = tmp_path / "rep"
    if previous:
        _write(out, "old")
    renames = []

    def interrupting(real):
        def rename(src, dst):
            real(src, dst)
            renames.append(dst)
            if len(renames) == after_rename:
                signal.raise_signal(signal.SIGINT)  # Python raises it at the next bytecode, here
        return rename

    monkeypatch.setattr(os, "rename", interrupting(os.rename))
    monkeypatch.setattr(os, "replace", interrupting(os.replace))
    if after_rename > (4 if previous else 3):  # a fresh folder has no previous figures/ to move aside
        _write(out, "new")
    else:
        with pytest.raises(KeyboardInterrupt):
            _write(out, "new")
    monkeypatch.undo()
    assert _versions(out) == {"new"}
    assert sorted(os.listdir(out)) == ["figures", "report.html", "report.md"]


def test_a_report_removes_the_staging_folders_a_killed_report_left(tmp_path):
    out = tmp_path / "rep"
    _write(out, "old")
    left = [".report.k3x_9q2a.tmp", ".figures.k3x_9q2a.tmp", ".figures.abcd1234.old"]  # this and earlier versions
    for name in left:
        (out / name).mkdir()
        (out / name / "1_schedule.png").write_bytes(b"half")
    kept = [".figures.mine", ".report.notes", ".figures.zzzzzzzz.old.bak"]
    for name in kept:
        (out / name).mkdir()
    (out / ".figures.filefile.old").write_text("a file, not a folder pplan makes")
    _write(out, "new")
    assert _versions(out) == {"new"}
    assert sorted(os.listdir(out)) == sorted(["figures", "report.html", "report.md", ".figures.filefile.old", *kept])


def test_a_disk_error_while_writing_keeps_the_previous_report(tmp_path, monkeypatch):
    out = tmp_path / "rep"
    _write(out, "old")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(PplanError, match="cannot write report folder .*No space left on device") as e:
        _write(out, "new")
    assert "free some space" in (e.value.hint or "")
    monkeypatch.undo()
    assert _versions(out) == {"old"}
    assert sorted(os.listdir(out)) == ["figures", "report.html", "report.md"]


# ---- SIGTERM and SIGHUP unwind a command as Ctrl-C does ------------------------------------------

# `pplan partition` whose first fsync (the plan's temporary file, complete, about to be renamed
# onto plan.json) says READY and waits for a line on stdin: the test signals it there.
_PAUSED_AT_FSYNC = """
import os, signal, sys
real_fsync = os.fsync
def paused(fd):
    os.fsync = real_fsync
    print("READY", flush=True)
    sys.stdin.readline()
    real_fsync(fd)
os.fsync = paused
if os.environ.get("TEST_IGNORE_SIGHUP"):
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts a command
import cli.app
sys.argv = ["pplan", *sys.argv[1:]]
cli.app.main()
"""


def _partition_stopped_at_fsync(tmp_path: Path, sig: int, **env: str) -> tuple[int, str, Path]:
    """(exit code, stderr, out folder) of a partition sent `sig` while its plan's temporary file exists."""
    out = tmp_path / "out"
    out.mkdir()
    args = ["partition", str(DATA / "sim_profile.csv"), "--devices", "2", "--global-batch", "8",
            "--out", str(out / "plan.json")]
    p = subprocess.Popen([sys.executable, "-c", _PAUSED_AT_FSYNC, *args], cwd=tmp_path, env=cli_env(**env),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdin is not None
        assert p.stdout.readline() == "READY\n", p.communicate(timeout=120)[1]
        assert [n for n in os.listdir(out) if n.startswith(".plan.json.") and n.endswith(".tmp")], os.listdir(out)
        p.send_signal(sig)
        _, err = p.communicate("go\n", timeout=120)  # releases the pause only where the signal was ignored
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, err, out


@pytest.mark.parametrize("sig,code,line", [(signal.SIGTERM, 143, "pplan: terminated"),
                                           (signal.SIGHUP, 129, "pplan: terminated"),
                                           (signal.SIGINT, 130, "pplan: interrupted")],
                         ids=["sigterm", "sighup", "sigint"])
def test_a_stop_signal_removes_the_temporary_file_and_leaves_one_line(tmp_path, sig, code, line):
    """Before, SIGTERM and SIGHUP killed the command and left `.plan.json.XXXX.tmp` behind."""
    got, err, out = _partition_stopped_at_fsync(tmp_path, sig)
    assert got == code, err
    assert err.splitlines()[-1] == line and "Traceback" not in err, err
    assert os.listdir(out) == []


def test_an_ignored_sighup_stays_ignored(tmp_path):
    """Under nohup (SIGHUP ignored) a closed terminal does not stop the command."""
    got, err, out = _partition_stopped_at_fsync(tmp_path, signal.SIGHUP, TEST_IGNORE_SIGHUP="1")
    assert got == 0, err
    assert os.listdir(out) == ["plan.json"]


def test_a_torchrun_rank_dies_by_sigterm_at_once(tmp_path):
    """A rank of a job (RANK, WORLD_SIZE set) keeps SIGTERM's default: its launcher stops it with
    SIGTERM and expects it gone, also while it waits in C code where no Python handler runs."""
    got, err, _ = _partition_stopped_at_fsync(tmp_path, signal.SIGTERM, RANK="0", WORLD_SIZE="1")
    assert got == -signal.SIGTERM, err


# ---- the console script: a Ctrl-C while the command line imports ---------------------------------

def test_the_console_script_is_the_light_entry():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["pplan"] == "cli.entry:main"
    code = "import sys, cli.entry; print(sorted({m.split('.')[0] for m in sys.modules} & {'typer', 'numpy', 'planner'}))"
    got = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=120)
    assert got.stdout == "[]\n", got.stderr


# Ctrl-C arrives while cli.app is being imported (a finder on its way raises it, as Python does).
_CTRL_C_IN_IMPORT = """
import signal, sys

class CtrlC:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "cli.app":
            signal.raise_signal(signal.SIGINT)

sys.meta_path.insert(0, CtrlC)
from cli.entry import main
sys.argv = ["pplan", "--version"]
main()
"""


def test_a_ctrl_c_while_importing_is_one_line():
    got = subprocess.run([sys.executable, "-c", _CTRL_C_IN_IMPORT], env=cli_env(), capture_output=True, text=True,
                         timeout=120)
    assert (got.returncode, got.stderr) == (130, "pplan: interrupted\n")


# ---- a wrong extension says what to give ------------------------------------------------------------

@pytest.mark.parametrize("args,hint", [
    (["partition", DATA / "sim_profile.csv", "--devices", "2", "--global-batch", "8", "--out", "plan.csv"],
     "must end in .json; the plan is written as JSON, e.g. --out plan.json"),
    (["partition", DATA / "sim_profile.csv", "--devices", "2", "--global-batch", "8", "--plot", "layers.svg"],
     "must end in .png; it is drawn as PNG, e.g. --plot layers.png"),
    (["simulate", DATA / "sim_plan.json", "--out", "sim.csv"], "must end in .json; it is written as JSON"),
    (["simulate", DATA / "sim_plan.json", "--timeline", "t.json"], "must end in .csv; it is written as CSV"),
    (["simulate", DATA / "sim_plan.json", "--plot", "g.txt"],
     "must end in .png or .svg; it is written as PNG or SVG, chosen by the suffix"),
], ids=["partition-out", "partition-plot", "simulate-out", "simulate-timeline", "simulate-plot"])
def test_a_wrong_extension_has_a_hint(pplan, tmp_path, monkeypatch, args, hint):
    monkeypatch.chdir(tmp_path)
    assert hint in one_error_line(*pplan(*args)[::2])
