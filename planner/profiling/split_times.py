"""The split backward's two times (zero-bubble I and W) against the whole backward.

A profile's bwd_input_ms and bwd_weight_ms are its bwd_ms in two parts: pplan's profiler times I
alone and writes W = bwd_ms - I (measure.py; inorder.py keeps that share when it retimes a pass),
and the analytic profile adds the two into bwd_ms. The simulator times a split-backward schedule's
I and W by them and every other schedule's B by bwd_ms, so two parts that add up to less than the
whole would make zero-bubble look faster than 1F1B by work that is not there (and a hand edit of one
column is an easy way to get there). Parts the file lacks are derived (half of bwd_ms each, or the
remainder of the one given); parts that disagree with bwd_ms beyond the file's rounding are refused.
One case is kept: I above bwd_ms with W 0 is what the profiler writes when timing noise puts I alone
above the whole backward; it prices zero-bubble no faster than the whole, so it is read as written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from planner.errors import ProfileError

__all__ = ["complete_backward_split", "SUM_TOLERANCE"]

SUM_TOLERANCE = 1e-3
"""How far bwd_input_ms + bwd_weight_ms may stray from bwd_ms, relative (plus 1e-6 ms): the profile
CSV keeps 6 significant digits, which moves the sum of committed profiles by at most 4.7e-6."""


def complete_backward_split(columns: dict[str, np.ndarray], present: frozenset[str], names: Sequence[str],
                            sizes: Sequence[int], source: str) -> None:
    """Fill the split columns `present` lacks, then refuse a (layer, size) whose parts do not add up."""
    bwd = columns["bwd_ms"]
    if "bwd_input_ms" not in present and "bwd_weight_ms" not in present:
        columns["bwd_input_ms"] = bwd / 2
        columns["bwd_weight_ms"] = bwd / 2
    elif "bwd_input_ms" not in present:
        columns["bwd_input_ms"] = np.maximum(bwd - columns["bwd_weight_ms"], 0)
    elif "bwd_weight_ms" not in present:
        columns["bwd_weight_ms"] = np.maximum(bwd - columns["bwd_input_ms"], 0)
    _check_sums(columns, names, sizes, source)


def _check_sums(columns: Mapping[str, np.ndarray], names: Sequence[str], sizes: Sequence[int], source: str) -> None:
    bwd, inp, wgt = columns["bwd_ms"], columns["bwd_input_ms"], columns["bwd_weight_ms"]
    total = inp + wgt
    slack = SUM_TOLERANCE * bwd + 1e-6
    bad = (total < bwd - slack) | ((wgt > 0) & (total > bwd + slack))
    if not bad.any():
        return
    layer, k = (int(x) for x in np.argwhere(bad)[0])
    i, w, b = float(inp[layer, k]), float(wgt[layer, k]), float(bwd[layer, k])
    raise ProfileError(
        f"{source}: layer {layer} ({names[layer]}) at micro_batch_size {sizes[k]}: bwd_input_ms {i:.6g} + bwd_weight_ms "
        f"{w:.6g} = {i + w:.6g}, but bwd_ms is {b:.6g}",
        "the split backward (zero-bubble I and W) is the whole backward in two parts: make them add up to bwd_ms, "
        "or leave both columns out (each is then half of it)")
