"""Text from someone else's file, made safe to print on a terminal.

A layer, device or stage name comes from a profile, plan, cluster or run file that another
person wrote. Printed raw, a name with an escape sequence (ESC ] ... BEL) retitles or rewrites
the reader's terminal, a newline forges a line of pplan's own output, and a 5 MB value turns a
one-line error into pages. Names are refused at read with `check_name`; everything else that
reaches the terminal inside an error goes through `printable` (cli/app.py does it for all of them).
"""

from __future__ import annotations

import unicodedata

from planner.errors import PplanError

__all__ = ["MAX_NAME_CHARS", "MAX_TEXT_CHARS", "MAX_MESSAGE_CHARS", "printable", "check_name", "terminal_safe", "check_text"]

# Longer than any module path a real model has (torchvision and Hugging Face names stay under 120).
MAX_NAME_CHARS = 256
# Free text a file may hold beside names (a path, a note, a warning line): PATH_MAX on Linux.
MAX_TEXT_CHARS = 4096
# An error line a person can read; the head says what failed, so the middle is what is cut.
MAX_MESSAGE_CHARS = 1000

# C0/C1 controls, DEL, and format characters such as the bidirectional overrides (U+202E) that
# make text display in an order other than its bytes'.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def _unsafe(ch: str) -> bool:
    return unicodedata.category(ch) in _UNSAFE_CATEGORIES


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` with every control or format character written as an escape (\\x1b, \\u202e),
    shortened to about `limit` characters by cutting its middle (the head names what failed and
    the tail holds the hint). Whitespace runs become one space, so the result is one line."""
    if any(_unsafe(ch) for ch in text if ch not in " \t\n\r"):
        text = "".join(ch if ch in " \t\n\r" or not _unsafe(ch) else _escape(ch) for ch in text)
    text = " ".join(text.split())
    if len(text) > limit:
        keep_head = (limit * 2) // 3
        keep_tail = max(0, limit - keep_head - 40)
        cut = len(text) - keep_head - keep_tail
        tail = text[len(text) - keep_tail:] if keep_tail else ""
        text = f"{text[:keep_head]} ...[{cut} characters cut]... {tail}".rstrip()
    return text


def _quoted(text: str, limit: int) -> str:
    """`text` for an error about its characters: every unsafe one escaped, a tab or newline too
    (printable would turn those into a space and hide what the error is about)."""
    return printable("".join(_escape(ch) if _unsafe(ch) else ch for ch in text[:limit * 2]), limit)


def check_name(name: str, what: str, error: type[PplanError], where: str) -> str:
    """`name` when it is a name a terminal can show as it is: not empty, at most MAX_NAME_CHARS
    characters, no control or format characters (a tab or newline included). `where` says where
    it came from (file:line); the error shows the name escaped and shortened."""
    if not name:
        raise error(f"{where}: {what} is empty", f"give each {what} a name")
    if len(name) > MAX_NAME_CHARS:
        raise error(f"{where}: {what} {printable(name, 60)!s} is {len(name)} characters long, more than {MAX_NAME_CHARS}",
                    "shorten it")
    bad = next((ch for ch in name if _unsafe(ch)), None)
    if bad is not None:
        raise error(f"{where}: {what} {_quoted(name, 80)} holds the control character {_escape(bad)}",
                    "names may hold letters, digits, punctuation and spaces only")
    return name


def terminal_safe(text: str) -> bool:
    """Whether `text` holds no control or format character (ESC, a newline, DEL, U+202E)."""
    if text.isascii():  # the common case at C speed: printable ASCII is safe
        return text.isprintable()
    return not any(_unsafe(ch) for ch in text)


def check_text(text: str, what: str, error: type[PplanError], where: str, limit: int, hint: str = "shorten it") -> str:
    """`text` when a terminal can show it as it is: at most `limit` characters, none of them a
    control or format character; empty is allowed. check_name's rule for text longer than a name
    (a path, a model spec, a search note)."""
    if len(text) > limit:
        raise error(f"{where}: {what} is {len(text):,} characters long, more than {limit:,}", hint)
    if not terminal_safe(text):
        bad = next(ch for ch in text if _unsafe(ch))
        raise error(f"{where}: {what} {_quoted(text, 80)} holds the control character {_escape(bad)}",
                    "write letters, digits, punctuation and spaces only")
    return text
