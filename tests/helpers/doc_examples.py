"""Examples the documentation shows (docs/models.md's python blocks, console lines and their output
in README.md and docs/), so tests run what a reader copies."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

__all__ = ["command_words", "console_example", "missing_from_output", "models_doc_example"]

REPO = Path(__file__).resolve().parents[2]
MODELS_DOC = REPO / "docs" / "models.md"


def models_doc_example(first_line: str) -> str:
    """The one python block of docs/models.md that starts with `first_line` (a file-name comment)."""
    blocks = re.findall(r"```python\n(.*?)```", MODELS_DOC.read_text(encoding="utf-8"), flags=re.S)
    found = [b for b in blocks if b.startswith(first_line)]
    if len(found) != 1:
        raise LookupError(f"docs/models.md has {len(found)} python blocks starting {first_line!r}, not one")
    return found[0]


def console_example(doc: str, command: str) -> list[str]:
    """The output lines `doc` (README.md, docs/x.md) shows under the console line `$ command` (as
    written, a trailing `# comment` included; a line ending in a backslash goes on in the next,
    joined by one space), up to the next `$ ` line or the block's end."""
    lines = (REPO / doc).read_text(encoding="utf-8").splitlines()
    found: list[list[str]] = []
    for i, line in enumerate(lines):
        if not line.startswith("$ "):
            continue
        logical, j = line.rstrip(), i + 1
        while logical.endswith("\\") and j < len(lines):
            logical, j = f"{logical[:-1].rstrip()} {lines[j].strip()}", j + 1
        if logical == f"$ {command}":
            shown = []
            for out in lines[j:]:
                if out.startswith(("$ ", "```")):
                    break
                shown.append(out)
            found.append(shown)
    if len(found) != 1:
        raise LookupError(f"{doc} shows `$ {command}` {len(found)} times, not once")
    return found[0]


def command_words(command: str) -> list[str]:
    """The arguments of a shown `pplan ...` console line, without `pplan` and its trailing comment."""
    words = shlex.split(command, comments=True)
    if words[:1] != ["pplan"]:
        raise ValueError(f"not a pplan command: {command!r}")
    return words[1:]


def _squeeze(line: str) -> str:
    return " ".join(line.split())


def missing_from_output(shown: list[str], output: str, errors: str = "") -> list[str]:
    """The shown lines that the command did not print, compared with runs of spaces folded: each
    shown line must come after the one before it in the same stream, stdout (`output`) or stderr
    (`errors`: warnings and "wrote FILE", which a terminal interleaves with stdout). `...` lines
    (the docs' cuts) and blank lines match nothing; table rules (`-----`) the docs leave out are
    skipped over."""
    streams = [[_squeeze(line) for line in text.splitlines()] for text in (output, errors)]
    at, missing = [0, 0], []
    for line in shown:
        want = _squeeze(line)
        if not want or want == "...":
            continue
        for k, lines in enumerate(streams):
            if want in lines[at[k]:]:
                at[k] = lines.index(want, at[k]) + 1
                break
        else:
            missing.append(line)
    return missing
