"""What torch's pipeline runtime holds per micro-batch beyond the layers' saved tensors, and until when.

  held output  = the stage's output where its last layer does not save it (`held_output`): torch's
                 PipelineStage keeps each forward's output in `fwd_cache` until that micro-batch's
                 backward; charged as part of the kept bytes (planner.cost.memory.kept_bytes).
  wgrad        = with a split backward (zero-bubble), what W starts from: the gradients at the
                 nodes where the weights' paths meet the input's (profile column `wgrad_bytes`;
                 0 on the first stage, whose whole backward torch runs at W), alive from the start
                 of I (torch's hooks store them as the backward runs; measured on the 3-rank run
                 below, the middle rank's I peaked one wgrad above the model's end-of-I charge).
  sent         = where torch's runtime waits for its sends only when the step ends (zb and
                 interleaved: planner.schedules.registry's holds_sends), each ended I's input
                 gradient and each ended W's output stay alive until then (an ended B is both).

When a split backward frees the held output is one rule, `pending_output`, read from torch 2.13's
stage.py: `backward_one_chunk` pops `fwd_cache` at I, and for W keeps in `backward_state` the stage
output on every stage but the last, where it keeps the loss instead. So a micro-batch whose I
has ended and whose W has not still holds its output except on the last stage. Measured (CPU,
gloo, hf:gpt2 4 x 128, zb, 8 micro-batches of 2, torch's allocator per action): each I of the last
stage freed 1,025,028 B besides adding its wgrad and input gradient, the 512,000 B of logits and
the loss's 513,028 B of saved tensors (the latter still charged until W); a stage that sends its
output on kept it to the step's end (its send holds it after W). The partitioner (planner.cost.memory.
moment_bytes) and the simulator (planner.schedules.memory.memory_peaks, the engine's timeline)
both price pending micro-batches with `sent_bytes`' third term, which is this rule.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from planner.profiling.profile import LayerCosts

__all__ = ["held_output_per_layer", "held_output", "pending_output", "wgrad_per_layer", "stage_wgrad",
           "wgrad_unmeasured_note", "sent_bytes"]


def held_output_per_layer(costs: LayerCosts) -> np.ndarray | None:
    """Per layer, bytes of its output that a pipeline runtime holds beyond what the layer saves
    itself: torch keeps each in-flight micro-batch's stage output until that micro-batch's
    backward. None when the profile does not say which outputs are saved (older profiles:
    no output is then charged twice, and their plans stay what they were)."""
    if costs.output_saved_bytes is None:
        return None
    out = np.asarray(costs.output_bytes, dtype=float)
    return np.maximum(out - np.asarray(costs.output_saved_bytes, dtype=float), 0.0)


def held_output(held: Sequence[float] | None, end: int) -> float:
    """The held output of a stage ending before layer `end` (its last layer's, 0 when unknown)."""
    return 0.0 if held is None or end < 1 else float(held[end - 1])


def pending_output(held_out: Any, is_last: Any) -> Any:
    """The part of a stage's held output (`held_out`) that a micro-batch still holds between the end
    of its I and the end of its W: all of it on every stage but the last (torch keeps the stage
    output in backward_state for W), none on the last (backward_state keeps the loss; the output
    left with fwd_cache at I). `is_last` is a bool or, with arrays of stages, a bool array (numpy).
    A number, a numpy array or a PuLP expression, as `held_out` is."""
    if isinstance(is_last, np.ndarray):
        return np.where(is_last, 0.0, held_out)
    return 0.0 if is_last else held_out


def wgrad_per_layer(costs: LayerCosts) -> np.ndarray | None:
    """Per layer, what a split backward's I keeps per micro-batch for its W (column wgrad_bytes; None: 0)."""
    return None if costs.wgrad_bytes is None else np.asarray(costs.wgrad_bytes, dtype=float)


def stage_wgrad(wgrad: Sequence[float] | None, first: int, end: int) -> float:
    """What stage [first, end) holds per micro-batch from the start of its I to the end of its W: the
    sum of its layers' wgrad; 0 for the first stage (torch runs the first stage's whole backward at W) and when unknown."""
    return 0.0 if wgrad is None or first == 0 else float(np.sum(np.asarray(wgrad, dtype=float)[first:end]))


def wgrad_unmeasured_note(costs: LayerCosts, split_backward: bool, sends_held: bool = False,
                          subject: str = "the plan's memory") -> str | None:
    """One line for a plan priced from a profile without wgrad_bytes where that column decides
    memory: a split backward (zero bubble) leaves out what each deferred W holds, and a runtime
    that holds its sends to the step's end (`sends_held`: interleaved, zb) what they hold
    (sent_bytes charges them only with the column); None otherwise."""
    if costs.wgrad_bytes is not None or not (split_backward or sends_held):
        return None
    left_out = ("what each micro-batch holds between its I and W and what its sends hold until the step ends"
                if split_backward else "what its sends hold until the step ends (each sent input gradient and output)")
    return (f"the profile has no wgrad_bytes column: {subject} leaves out {left_out} (counted as 0); "
            "`pplan profile` writes it (measured, or --analytic for the built-in gpt)")


def sent_bytes(bytes_in: Any, bytes_out: Any, held_out: Any, wgrad_measured: bool, is_last: Any = False) -> tuple[Any, Any, Any]:
    """planner.cost.memory.moment_bytes' `sent`: (per ended I its input gradient, per ended W its
    output, per pending W its pending_output(held_out, is_last)); an ended B, where the runtime holds
    its sends, counts as an ended I and W. The first two, held by torch's sends until the step ends,
    only where the profile measured wgrad_bytes (older profiles' plans keep them out); the third
    whatever the profile measured: it is when the held output is freed."""
    pending = pending_output(held_out, is_last)
    return (bytes_in, bytes_out, pending) if wgrad_measured else (0.0, 0.0, pending)
