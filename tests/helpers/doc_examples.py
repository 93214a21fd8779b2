"""The python examples of docs/models.md, so tests run what the documentation shows."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["models_doc_example"]

MODELS_DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"


def models_doc_example(first_line: str) -> str:
    """The one python block of docs/models.md that starts with `first_line` (a file-name comment)."""
    blocks = re.findall(r"```python\n(.*?)```", MODELS_DOC.read_text(encoding="utf-8"), flags=re.S)
    found = [b for b in blocks if b.startswith(first_line)]
    if len(found) != 1:
        raise LookupError(f"docs/models.md has {len(found)} python blocks starting {first_line!r}, not one")
    return found[0]
