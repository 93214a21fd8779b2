"""What torch's pipeline runtime holds per micro-batch beyond the layers' saved tensors, and until when.

  held output  = the stage's output where its last layer does not save it (`held_output`): torch's
                 PipelineStage keeps each forward's output in `fwd_cache` until that micro-batch's
                 backward; charged as part of the kept bytes (planner.cost.memory.kept_bytes).
  wgrad        = with a split backward (zero-bubble), what W starts from: the gradients at the
                 nodes where the weights' paths meet the input's (profile column `wgrad_bytes`;
                 0 on the first stage, whose whole backward torch runs at W), charged from the end
                 of I to the end of W; while the I runs, its stored wgrads are the running I's.
  running I    = while an I runs, the stage's backward goes from its last layer to its first and
                 each layer's wgrad stays once made: during layer j's part, the wgrads of the
                 layers after j are held and j's own part holds the larger of its workspace and its
                 wgrad. The running I's bytes are the largest over j of those two, at least the
                 stage's transient; `running_i_extra` is what they exceed the largest workspace by,
                 charged on top of the transient. Measured per action (torch's CPU allocator, gpt
                 hidden 256, vocabulary 8,192, 3 ranks, zb): 3 blocks (workspace 5 MiB, wgrad
                 11 MiB each) peaked 33 MiB above the forward's end plus the 1 MiB input gradient,
                 not 5 + 33; the LM head (workspace 64 MiB with the logits' gradient in it, wgrad
                 33 MiB) peaked its workspace, not workspace + wgrad.
  sent         = where torch's runtime waits for its sends only when the step ends (zb and
                 interleaved: planner.schedules.registry's holds_sends), each ended I's input
                 gradient and each ended W's output stay alive until then (an ended B is both).

When a split backward frees the held output is one rule, `pending_output`, read from torch 2.13's
stage.py: `backward_one_chunk` pops `fwd_cache` at I, and for W keeps in `backward_state` the stage
output on every stage but the last, where it keeps the loss instead. So a micro-batch whose I
has ended and whose W has not still holds its output except on the last stage. There the I frees
the loss's saved tensors too (`loss_saved_bytes`): torch's stage_backward_input detaches the loss
once the input gradient is made, and W starts from the nodes where the weights meet the input's
path, below the loss, so nothing holds the loss's part of the graph any more. Measured (CPU,
gloo, hf:gpt2 4 x 128, zb, 8 micro-batches of 2, torch's allocator per action): each I of the last
stage freed 1,025,028 B besides adding its wgrad and input gradient, the 512,000 B of logits and
the loss's 513,028 B of saved tensors; a stage that sends its output on kept it to the step's end
(its send holds it after W). At a larger vocabulary the loss's part decides the last rank's peak:
gpt (4 x 256, vocabulary 8,192), 2 ranks, zb, 4 micro-batches of 32, the last rank's I freed
128 MiB of logits and 128 MiB of the loss's log-probabilities; charged until W, they put the
predicted peak at 972.2 MiB against 712.2 MiB measured. The partitioner (planner.cost.memory.
moment_bytes) and the simulator (planner.schedules.memory.memory_peaks, the engine's timeline)
both price pending micro-batches with `sent_bytes`' third term, which is this rule.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from planner.profiling.profile import LayerCosts

__all__ = ["held_output_per_layer", "held_output", "loss_saved_bytes", "pending_output", "wgrad_per_layer",
           "stage_wgrad", "running_i_parts", "running_i_extra", "wgrad_unmeasured_note", "sent_bytes"]


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


def loss_saved_bytes(costs: LayerCosts) -> float:
    """What the loss saves for its backward per micro-batch (cross-entropy's log-probabilities; the
    target is the batch's, planner.cost.batch): the last layer's checkpoint_extra_bytes beyond the
    RNG state every layer's holds (the least of the others'; with one layer the whole column, a
    few KiB of RNG state too much). 0 without the column."""
    extra = costs.checkpoint_extra_bytes
    if extra is None or len(extra) == 0:
        return 0.0
    extra = np.asarray(extra, dtype=float)
    rng_state = float(np.min(extra[:-1])) if len(extra) > 1 else 0.0
    return max(float(extra[-1]) - rng_state, 0.0)


def pending_output(held_out: Any, is_last: Any, loss_saved: float = 0.0) -> Any:
    """What a micro-batch holds between the end of its I and the end of its W of the stage's held
    output (`held_out`), less what its I freed of the loss's saved tensors (`loss_saved`,
    loss_saved_bytes): all of the output on every stage but the last (torch keeps the stage output
    in backward_state for W); on the last none (backward_state keeps the loss; the output left with
    fwd_cache at I), and the loss's tensors went with it: -loss_saved. `is_last` is a bool or, with
    arrays of stages, a bool array (numpy). A number, a numpy array or a PuLP expression, as
    `held_out` is."""
    if isinstance(is_last, np.ndarray):
        return np.where(is_last, -loss_saved, held_out)
    return -loss_saved if is_last else held_out


def wgrad_per_layer(costs: LayerCosts) -> np.ndarray | None:
    """Per layer, what a split backward's I keeps per micro-batch for its W (column wgrad_bytes; None: 0)."""
    return None if costs.wgrad_bytes is None else np.asarray(costs.wgrad_bytes, dtype=float)


def stage_wgrad(wgrad: Sequence[float] | None, first: int, end: int) -> float:
    """What stage [first, end) holds per micro-batch from the end of its I to the end of its W (while the
    I runs: running_i_extra): the sum of its layers' wgrad; 0 for the first stage (torch runs the first stage's whole backward at W) and when unknown."""
    return 0.0 if wgrad is None or first == 0 else float(np.sum(np.asarray(wgrad, dtype=float)[first:end]))


def running_i_parts(workspace: Sequence[float] | None, wgrad: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(P, a, ws) for running_i_extra: P the prefix sums of `wgrad` (length L+1), a[j] = max(ws[j],
    wgrad[j]) - P[j+1], ws the workspace (zeros without the column). A stage [first, end)'s running
    I holds P[end] + max a[first:end] (module docstring); the DP reads the same arrays as tables."""
    w = np.asarray(wgrad, dtype=float)
    ws = np.zeros_like(w) if workspace is None else np.asarray(workspace, dtype=float)
    prefix = np.concatenate([[0.0], np.cumsum(w)])
    return prefix, np.maximum(ws, w) - prefix[1:], ws


def running_i_extra(workspace: Sequence[float] | None, wgrad: Sequence[float] | None, first: int, end: int) -> float:
    """What a running I of stage [first, end) holds beyond its transient: the running I's bytes
    (module docstring) less the stage's largest workspace, at least 0. 0 for the first stage (its
    I computes nothing), for an empty stage and without wgrad_bytes. With recompute the transient
    grows and this stays: an upper bound there."""
    if wgrad is None or first == 0 or end <= first:
        return 0.0
    prefix, a, ws = running_i_parts(workspace, wgrad)
    return max((float(prefix[end]) + float(np.max(a[first:end]))) - float(np.max(ws[first:end])), 0.0)


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


def sent_bytes(bytes_in: Any, bytes_out: Any, held_out: Any, wgrad_measured: bool, is_last: Any = False,
               loss_saved: float = 0.0) -> tuple[Any, Any, Any]:
    """planner.cost.memory.moment_bytes' `sent`: (per ended I its input gradient, per ended W its
    output, per pending W its pending_output(held_out, is_last, loss_saved)); an ended B, where the
    runtime holds its sends, counts as an ended I and W. The first two, held by torch's sends until
    the step ends, only where the profile measured wgrad_bytes (older profiles' plans keep them out);
    the third whatever the profile measured: it is when the held output and the loss's tensors are freed."""
    pending = pending_output(held_out, is_last, loss_saved)
    return (bytes_in, bytes_out, pending) if wgrad_measured else (0.0, 0.0, pending)
