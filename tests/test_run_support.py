"""Deprecated: the shared helpers live in tests/helpers/ now. These re-exports keep tests still
being written against this module working; import from `helpers.*` instead, then delete this file."""

from __future__ import annotations

from helpers.cli import REPO, run_pplan
from helpers.equivalence import EQUIVALENCE_THREADS, torch_threads
from helpers.figures import PNG_MAGIC, assert_drawn_png, color_share, png_pixels
from helpers.plans import synthetic_spec, write_plan, write_synthetic_profile

__all__ = ["REPO", "pplan", "EQUIVALENCE_THREADS", "torch_threads", "PNG_MAGIC", "assert_drawn_png", "color_share",
           "png_pixels", "synthetic_spec", "write_plan", "write_synthetic_profile"]


def pplan(*args: str, timeout: float = 120, cwd=None):
    """Run the CLI in a subprocess (now `helpers.cli.run_pplan`)."""
    return run_pplan(*args, timeout=timeout, cwd=cwd)
