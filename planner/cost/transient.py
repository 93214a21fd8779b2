"""The recompute transient: what a stage holds on top of its kept activations while a backward runs.

A stage runs one layer's backward at a time. During layer j's backward its workspace is alive
(profile column workspace_bytes: its output, the gradients flowing through it, the temporaries
of its ops; on the last layer the loss's logit gradients) and, when j is recomputed, one
micro-batch of its activations lives again. So the stage's transient is

    max over layers j of the stage of  workspace_j + (activation_j if j is recomputed),

not the largest recomputed activation plus the largest workspace of any layer: those two maxima
belong to different layers, which never run their backward at once. Measured (a gpt with 4
blocks, GPipe on 2 CPU ranks, every layer recomputed): the first rank's allocator peak was the
recomputed block's activations + that block's own workspace, 3.1 MiB under the sum of the two
maxima (the embedding's workspace is larger) and equal to this form.

What a recomputed layer brings back is its activations less what its checkpoint keeps besides
its input all along (`rematerialized_bytes`): on the last layer the loss's saved tensors (profile
column checkpoint_extra_bytes), which the runtime keeps outside the checkpoint and kept_bytes
charges per micro-batch already. Measured on the same run: the last rank (the LM head and the
loss, recomputed) peaked at its kept bytes + its workspace, 34 MiB (+9.8% under GPipe, +20% under
1F1B) under the charge of its whole activations again; with the loss's tensors taken off, +0.6%.

Profiles without a workspace column: the largest recomputed activation (0 without recompute), as
before. The solvers price the same form: planner.partition.problem (brute force, ILP rows) and
planner.partition.dp through `layer_transient`.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

__all__ = ["transient_bytes", "layer_transient", "rematerialized_bytes"]


def transient_bytes(activation: Sequence[float], recompute: Iterable[int], workspace: Sequence[float] | None = None,
                    first: int = 0, end: int | None = None) -> float:
    """The transient of stage [first, end) (end None: through the last layer) with `recompute`
    checkpointed (module docstring); `activation` per layer what its recompute brings back
    (rematerialized_bytes), `workspace` the profile's column or None."""
    rec = set(recompute)
    if workspace is None:
        return max((float(activation[i]) for i in rec), default=0.0)
    last = len(workspace) if end is None else end
    return max((float(workspace[i]) + (float(activation[i]) if i in rec else 0.0) for i in range(first, last)), default=0.0)


def rematerialized_bytes(kept_activation: Sequence[float], checkpoint_extra: Sequence[float] | None) -> np.ndarray:
    """Per layer, what its recompute brings back during its backward: `kept_activation`
    (planner.cost.kept_activation_bytes) less what the checkpoint keeps besides its input
    (`checkpoint_extra`, the profile's checkpoint_extra_bytes; None: nothing, the older model),
    never below 0. The RNG state in that column is no saved tensor: a few KiB too little at most."""
    act = np.asarray(kept_activation, dtype=float)
    return act if checkpoint_extra is None else act - np.minimum(np.asarray(checkpoint_extra, dtype=float), np.maximum(act, 0.0))


def layer_transient(activation: Sequence[float], workspace: Sequence[float] | None) -> np.ndarray:
    """Per layer, its term of the transient when it is recomputed: `activation` (rematerialized_bytes)
    + workspace (the activation alone without a workspace column). A layer not recomputed contributes its
    workspace alone, which is never more: the stage's largest workspace bounds the transient
    from below whatever is recomputed."""
    act = np.asarray(activation, dtype=float)
    return act if workspace is None else act + np.asarray(workspace, dtype=float)
