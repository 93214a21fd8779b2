"""Which pplan file a file is, from its first bytes: a plan given where a profile belongs (or a
run where a plan does) is then named for what it is, with the command that reads it, instead of
failing as "invalid JSON" or "missing column(s) layer, name".

pplan's JSON files carry `"format": "pplan-KIND/N"` among their first keys and its CSV files a
`# format: pplan-KIND/N` line (a profile may also start at its `layer,` header); a simulation JSON
has no format and is told by its keys, as planner.jsontypes.file_kind tells one once parsed.
"""

from __future__ import annotations

import re

__all__ = ["SNIFF_BYTES", "FILE_KINDS", "TIMELINE_HEADER", "head_kind", "wrong_kind"]

SNIFF_BYTES = 4096
"""Bytes of a file's start that tell which pplan file it is: pplan writes a `format` within the first 30 (a
simulation JSON's keys within 60); 4 KiB leaves room for a hand-edited file's reordered keys or comments."""
_JSON_FORMAT = re.compile(rb'"format"\s*:\s*"(pplan-([a-z]+)/[0-9]{1,9})"')
_CSV_FORMAT = re.compile(rb"#\s*format\s*:\s*(pplan-([a-z]+)/[0-9]{1,9})")
# A simulation JSON has no format; pplan writes iteration_ms as its first key. Anywhere else in the head
# the key proves nothing: a plan without a format (allowed) holds it in its `predicted` record.
_SIMULATION_START = re.compile(rb'\{\s*"iteration_ms"\s*:')
# The header pplan writes on a timeline CSV (planner.simulation.result.TIMELINE_COLUMNS, which sits
# above this module; tests/test_newcomer_cli.py holds the two equal).
TIMELINE_HEADER = b"device,stage,kind,microbatch,start_ms,end_ms"
FILE_KINDS = {  # kind (planner.jsontypes.file_kind's name) -> (the file in words, a command that reads one)
    "plan": ("plan JSON", "`pplan simulate {file}`"),
    "profile": ("profile CSV", "`pplan partition {file}`"),
    "run": ("run JSON", "`pplan report --run {file}`"),
    "sim": ("simulation JSON", "`pplan report --sim {file}`"),
    "calibration": ("calibration JSON", "`pplan simulate PLAN --calibration {file}`"),
    "cluster": ("cluster JSON", "`pplan partition PROFILE --cluster {file}`"),
    "hardware": ("hardware JSON", "`pplan hardware {file}`"),
    "machine": ("machine file", "`pplan run PLAN --machine-file {file}`"),
    "timeline": ("timeline CSV", "`pplan report --timeline {file}`"),
}


def head_kind(head: bytes) -> tuple[str, str] | None:
    """(kind, what says so) of a file by its first bytes, e.g. ('run', "format 'pplan-run/1'"): a pplan JSON by
    its first `format`, a simulation JSON by its keys, a profile by its `# format:` line or `layer,` header."""
    text = head[:SNIFF_BYTES].removeprefix(b"\xef\xbb\xbf").lstrip()
    if text.startswith(b"{"):
        if found := _JSON_FORMAT.search(text):
            return found[2].decode(), f"format {found[1].decode()!r}"
        return ("sim", "first key iteration_ms") if _SIMULATION_START.match(text) else None
    for line in text.splitlines():  # the comment lines before the header, then the header
        line = line.strip()
        if line.startswith(b"#") and (found := _CSV_FORMAT.match(line)):
            return found[2].decode(), f"line '# format: {found[1].decode()}'"
        if line and not line.startswith(b"#"):
            if line.startswith(TIMELINE_HEADER):
                return "timeline", "header 'device,stage,kind,...'"
            return ("profile", "header 'layer,...'") if line.startswith(b"layer,") else None
    return None


def wrong_kind(source: str, head: bytes, expected: str, make: str) -> tuple[str, str] | None:
    """(message, hint) refusing `source`, which starts with `head`, when head_kind says it is another file than
    `expected` (a FILE_KINDS kind): what it is, what reads it, then `make` (how to get one expected); else None."""
    found = head_kind(head)
    if found is None or found[0] == expected:
        return None
    words, reader = FILE_KINDS.get(found[0], (f"pplan {found[0]} file", None))
    reads = f"{reader.replace('{file}', source)} reads it; " if reader else ""
    return f"{source} is a {words} (by its {found[1]}), not a {FILE_KINDS[expected][0]}", reads + make
