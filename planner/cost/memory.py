"""Memory of a stage: static state, activations in flight, recompute, boundary buffers.

On a device running a stage [first, end) with recompute set R (layers checkpointed):

  weights      = sum param_bytes
  gradients    = weights (same dtype as the parameters), from the end of the stage's first
                 weight-gradient action to the optimizer step (below)
  optimizer    = state factor x weights: Adam/AdamW keep two moments, SGD with momentum one
                 buffer, plain SGD none. torch keeps a float32 parameter's state in its dtype
                 (2x, 1x, 0x the weights); a 16-bit parameter trains through an fp32 master copy
                 with fp32 state (planner.master_weights): 4 + 4 per moment bytes per parameter,
                 6x, 4x, 2x the bf16 weights (`optimizer_factor`).
  activations  = in_flight x kept + transient, where
                 kept = sum activation_bytes of layers not in R
                      + sum checkpoint input bytes of layers in R (a checkpoint keeps its input)
                      - what a layer saves that the layer before it in the stage saved already
                        (`shared_input_bytes`: a ReLU's output saved again as the next layer's input)
                      - what the stage's first layer saves of its input (`input_saved_bytes`):
                        torch's stage received it into a buffer it holds anyway (`stage_entry_bytes`)
                      + pass-through bytes (skip tensors the stage only forwards)
                      + the stage's output, which the runtime holds until the micro-batch's
                        backward, where its last layer does not save it (`held_output`)
                 transient = the largest over the stage's layers j of workspace_bytes[j]
                 + (activation_bytes[j] if j in R, less the loss's tensors j's checkpoint
                 keeps anyway): a stage runs one layer's backward at a time, and during it
                 that layer's workspace (its output, the gradients flowing through it,
                 temporaries; the loss's logit gradients) is alive, and, when it is
                 recomputed, one micro-batch of its activations again (planner.cost.transient)
  buffers      = torch's PipelineStage allocates, at its first step and for good, one receive
                 buffer per micro-batch for the activation (bytes in) and one for its gradient
                 (bytes out): M x (bytes in + bytes out). The first stage holds the step's whole
                 input batch instead, M x the model input (`buffer_bytes`). The input gradient
                 a backward sends is in its first layer's workspace; once sent it is not at the
                 peak (measured: charging it too over-predicted a ResNet's last rank by 2 MiB).
  wgrad, sent  = with a split backward (zero-bubble): what each micro-batch between its I and W
                 holds for W; and, where torch's runtime waits for its sends only when the step ends
                 (zb, interleaved: planner.schedules.registry's holds_sends), what they hold until
                 then (planner.cost.held: `stage_wgrad`, `sent_bytes`, and `pending_output`, the
                 rule of when the held output is freed: at I on the last stage, at W on the others).
  warm-up send = 1F1B: one output more from a micro-batch's backward on, which torch's class's
                 warm-up send still holds (registry holds_warmup_send, Moment.warmup_send).
  Profiles without `input_saved_bytes` (made before pplan measured it) keep the older model, so
  their plans stay what they were: every activation_bytes counted in full, buffers 2 x (bytes in
  + bytes out).

The peak is the largest over the stage's moments (planner.schedules.memory's
stage_memory_moments derives them from each rank's order of actions, the same states the
simulator's memory_peaks walks): a moment holds in_flight micro-batches' kept bytes, the
transient if a backward of the stage runs then (B or I; W on the first stage, whose I computes
nothing), the gradients if they exist by then (from the end of the stage's first weight-gradient
action), pending_w micro-batches' wgrad and, while an I runs (running_i), what the wgrads it
stores exceed the transient by (planner.cost.held.running_i_extra), while a split W runs past the
first stage (running_w) its fresh weight gradients (planner.cost.w_workspace); and the optimizer step:
  moment = weights + optimizer + buffers + in_flight x kept [+ transient] [+ gradients]
           + pending_w x wgrad [+ running I extra] [+ W workspace]
           + sent_grads x bytes in + (sent_grads - pending_w) x bytes out
           + pending_w x (pending_output - held output)   (on the last stage: - held output - loss's tensors)
           [+ bytes out: the warm-up send's output]
  step   = weights + gradients + optimizer + buffers + the optimizer step's temporaries
(in_flight counts a micro-batch until its W ends, with its held output in kept: the last term
takes that off where torch freed it at I). GPipe's activation peak (its first backward) holds no
gradients yet. Where a rank runs one stage this is the simulator's device peak exactly; several
stages on a rank (interleaved) are each charged at their own worst moment: at least the
simulator's peak.

`stage_bytes` is that maximum, written once; it takes numbers, numpy arrays (the DP prices every
(first, end) at once) or PuLP expressions (the ILP's memory rows), so every solver charges the
same formula. Recomputing layers lowers the no-recompute memory by `recompute_saving`.
`in_flight` (micro-batches held at once) is a property of the schedule
(planner.schedules.memory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from planner.cost.held import held_output
from planner.cost.transient import transient_bytes
from planner.errors import PplanError
from planner.graph.crossing import passthrough_bytes
from planner.graph.edges import SkipEdge
from planner.limits import OPTIMIZERS
from planner.profiling.profile import LayerCosts

__all__ = [
    "OPTIMIZER_STATE_FACTOR",
    "MemoryBreakdown",
    "optimizer_factor",
    "static_bytes_per_layer",
    "checkpoint_input_bytes",
    "boundary_bytes",
    "receive_buffer_microbatches",
    "scaled_skip_edges",
    "kept_bytes",
    "transient_bytes",
    "workspace_max",
    "optimizer_workspace",
    "kept_activation_bytes",
    "stage_entry_bytes",
    "runtime_buffers",
    "buffer_bytes",
    "stage_bytes",
    "fixed_bytes",
    "moment_bytes",
    "recompute_saving",
    "stage_memory",
]

# State buffers per parameter (each the size of a float32 parameter or of an fp32 master), one entry
# per name of planner.limits.OPTIMIZERS, in its order (tests/test_one_home_per_constant.py holds them equal).
OPTIMIZER_STATE_FACTOR = {"adam": 2.0, "adamw": 2.0, "sgd": 1.0, "sgd-plain": 0.0}

_MASTER_BYTES = 4.0
"""Bytes of one fp32 value: a 16-bit parameter's master copy and each of its state buffers."""


def optimizer_factor(optimizer: str, element_bytes: float = 4.0) -> float:
    """Optimizer state bytes per parameter byte, for parameters of `element_bytes` each (module
    docstring): the state buffers in the parameter's dtype from 4 bytes up; below, an fp32 master
    and fp32 buffers."""
    try:
        buffers = OPTIMIZER_STATE_FACTOR[optimizer]
    except KeyError:
        raise PplanError(f"unknown optimizer {optimizer!r}", f"choose one of {', '.join(OPTIMIZERS)}") from None
    if element_bytes >= _MASTER_BYTES:
        return buffers
    return _MASTER_BYTES * (1.0 + buffers) / element_bytes


def static_bytes_per_layer(param_bytes: Any, optimizer: str, element_bytes: float = 4.0) -> np.ndarray:
    """Per layer: weights + gradients + optimizer state, for parameters of `element_bytes` each."""
    return np.asarray(param_bytes, dtype=float) * (2.0 + optimizer_factor(optimizer, element_bytes))


def checkpoint_input_bytes(costs: LayerCosts) -> np.ndarray:
    """Per layer: bytes a checkpointed layer keeps, its input (the previous layer's output, or the
    model input for layer 0; for a model that is not a chain, everything it reads from earlier layers),
    plus what the profile measured it keeps besides (`checkpoint_extra_bytes`: the checkpoint's RNG
    state; on the last layer the loss's saved tensors, which the runtime keeps outside the stage).
    Profiles without that column: the input alone, so their plans stay what they were."""
    out = np.asarray(costs.output_bytes, dtype=float)
    kept = (np.asarray(costs.layer_input_bytes, dtype=float) if costs.layer_input_bytes is not None
            else np.concatenate([[float(costs.input_bytes)], out[:-1]]))
    return kept if costs.checkpoint_extra_bytes is None else kept + np.asarray(costs.checkpoint_extra_bytes, dtype=float)


def boundary_bytes(costs: LayerCosts) -> np.ndarray:
    """Length L+1: bytes per micro-batch crossing the cut before layer x (0 at x = 0 and x = L).

    A chain sends the previous layer's output; otherwise every tensor crossing the cut, hop by
    hop (LayerCosts.crossing_bytes, skip tensors included).
    """
    inner = costs.crossing_bytes if costs.crossing_bytes is not None else np.asarray(costs.output_bytes, dtype=float)[:-1]
    return np.concatenate([[0.0], np.asarray(inner, dtype=float), [0.0]])


# The last 16 (edge set id, micro-batch size) -> (that edge set, kept so the id stays its, scaled edges): the DP
# prices every stage with one costs, and rebuilding 32,000 edges a stage was 23 of 35 s of a 4,000-layer profile's.
_SCALED: dict[tuple[int, int], tuple[tuple[SkipEdge, ...], tuple[SkipEdge, ...]]] = {}


def scaled_skip_edges(costs: LayerCosts) -> tuple[SkipEdge, ...]:
    """The skip edges with `bytes_per_sample` holding bytes per micro-batch; () for a chain."""
    edges, b = costs.skip_edges, costs.micro_batch_size
    remembered = type(edges) is tuple and len(edges) > 0  # only an immutable edge set is known by its id
    hit = _SCALED.get((id(edges), b)) if remembered else None
    if hit is not None and hit[0] is edges:
        return hit[1]
    scaled = tuple(SkipEdge(e.src, e.dst, e.bytes_per_sample * b, e.also_to) for e in edges)
    if remembered:
        if len(_SCALED) >= 16:
            _SCALED.pop(next(iter(_SCALED)))
        _SCALED[(id(edges), b)] = (edges, scaled)
    return scaled


def kept_bytes(activation: Sequence[float], checkpoint_input: Sequence[float], first: int, end: int,
               recompute: Iterable[int], edges: Sequence[SkipEdge] = (), held: Sequence[float] | None = None,
               entry: Sequence[float] | None = None) -> float:
    """Bytes stage [first, end) keeps per micro-batch in flight (module docstring).

    `activation`: kept_activation_bytes. `edges` are scaled_skip_edges (bytes per micro-batch);
    none for a chain. `held`: held_output_per_layer (the stage's output the runtime holds), None
    for none. `entry`: stage_entry_bytes, None for none. A recomputed first layer keeps its
    checkpoint input and the entry correction too: at least what it really keeps, never less.
    """
    rec = set(recompute)
    kept = sum(float(checkpoint_input[i]) if i in rec else float(activation[i]) for i in range(first, end))
    kept += held_output(held, end)
    if entry is not None and end > first:
        kept += float(entry[first])
    if edges:
        kept += passthrough_bytes(first, end, edges)
    return kept


# Optimizers whose step makes parameter-sized temporaries (Adam's denominator); SGD over float32
# parameters updates in place.
_STEP_TEMPORARIES = frozenset({"adam", "adamw"})


def optimizer_workspace(workspace: Sequence[float] | None, first: int, end: int, optimizer: str,
                        element_bytes: float = 4.0) -> float:
    """Temporaries of the optimizer step over layers [first, end): the largest layer's measured
    Adam step (torch's single-tensor Adam, its default on CPU, updates one parameter at a time;
    its multi-tensor form on CUDA would hold the stage's sum). 0 for SGD over float32 parameters
    and without the column; over 16-bit ones (`element_bytes` < 4) every optimizer steps fp32
    masters and makes their fp32 gradients (planner.master_weights), so SGD is charged the
    measured Adam step too, an upper bound. The step runs after the backward, when no
    activations are held, so a stage's peak is the larger of its activation peak and this
    (stage_bytes)."""
    makes_temporaries = optimizer in _STEP_TEMPORARIES or element_bytes < _MASTER_BYTES
    return workspace_max(workspace, first, end) if makes_temporaries else 0.0


def workspace_max(workspace: Sequence[float] | None, first: int, end: int) -> float:
    """The largest workspace of layers [first, end): a stage runs one layer at a time, so one
    layer's output, gradients and temporaries are alive on top of what the stage keeps (0 when
    the profile has no workspace column)."""
    if workspace is None or end <= first:
        return 0.0
    return float(max(workspace[first:end]))


def kept_activation_bytes(costs: LayerCosts) -> np.ndarray:
    """Per layer, the bytes it keeps for its backward beyond what the layer before it in the same
    stage keeps already: activation_bytes less shared_input_bytes (module docstring). A stage's
    first layer gets the shared part back through stage_entry_bytes. Profiles without
    input_saved_bytes: activation_bytes as it is (the older model)."""
    act = np.asarray(costs.activation_bytes, dtype=float)
    if not runtime_buffers(costs) or costs.shared_input_bytes is None:
        return act
    return act - np.minimum(np.asarray(costs.shared_input_bytes, dtype=float), act)


def stage_entry_bytes(costs: LayerCosts) -> np.ndarray | None:
    """Per layer x, what a stage starting at x keeps differently from kept_activation_bytes' sum:
    the shared part of layer x counts again (the layer before is on another device), and the part
    of its input layer x saves is the stage's receive buffer (or, on the first stage, the input
    batch), which buffer_bytes charges: shared_input_bytes[x] - input_saved_bytes[x] (at most 0).
    None for profiles without input_saved_bytes."""
    if not runtime_buffers(costs):
        return None
    saved_in = np.asarray(costs.input_saved_bytes, dtype=float)
    shared = np.zeros_like(saved_in) if costs.shared_input_bytes is None else np.asarray(costs.shared_input_bytes, dtype=float)
    return np.minimum(shared, saved_in) - saved_in


def runtime_buffers(costs: LayerCosts) -> bool:
    """Whether the profile says what each layer saves of its input (`input_saved_bytes`): then a
    stage's input is charged once, as torch's receive buffers (buffer_bytes with n_microbatches)."""
    return costs.input_saved_bytes is not None


def receive_buffer_microbatches(runtime_buffers: bool, n_microbatches: int) -> int | None:
    """buffer_bytes' `n_microbatches`: the plan's micro-batch count when the profile measured what
    each layer saves of its input (runtime_buffers), None for the older model."""
    return n_microbatches if runtime_buffers else None


def buffer_bytes(bytes_in: Any, bytes_out: Any, n_microbatches: int | None = None, batch_in: Any = 0.0) -> Any:
    """Receive and send buffers of a stage (module docstring). `n_microbatches` None: the older
    model, 2 x (bytes in + bytes out). Else torch's: M x (bytes in + bytes out + batch_in),
    `batch_in` the model input per micro-batch when the stage is the first (its input batch), else 0."""
    if n_microbatches is None:
        return 2.0 * (bytes_in + bytes_out)
    return n_microbatches * (bytes_in + bytes_out + batch_in)


def fixed_bytes(static: Any, bytes_in: Any, bytes_out: Any, n_microbatches: int | None = None, batch_in: Any = 0.0) -> Any:
    """What a stage holds at every moment and the optimizer step: static (weights + gradients +
    optimizer state) + buffer_bytes. stage_bytes adds the largest moment's activations to it."""
    return static + buffer_bytes(bytes_in, bytes_out, n_microbatches, batch_in)


def moment_bytes(moment: Any, kept: Any, transient: Any, gradients: Any = 0.0, wgrad: Any = 0.0,
                 sent: tuple[Any, Any, Any] = (0.0, 0.0, 0.0), held_out: Any = 0.0, running: Any = 0.0,
                 w_work: Any = 0.0, output: Any = 0.0) -> Any:
    """One moment's bytes beyond fixed_bytes: moment.in_flight x kept, + transient if a backward
    runs then (moment.transient), - gradients if they do not exist yet (moment.gradients false;
    fixed_bytes counts them), + moment.pending_w x wgrad (stage_wgrad) + `running` if an I runs then
    (moment.running_i; planner.cost.held.running_i_extra: the wgrads it stores beyond the transient)
    + `w_work` if a split W runs then (moment.running_w; planner.cost.w_workspace)
    + what sends hold (sent_bytes, per ended I and ended W) + per pending W what pending_output says
    it holds (sent[2]) less the stage's held output (`held_out`, part of kept: in_flight counts a
    micro-batch until its W ends) + `output` (the stage's output bytes) where moment.warmup_send.
    `moment`: a planner.schedules.memory.Moment, or a MomentStack (every moment of a stage at once:
    one row each, the DP's dozens of moments of a held-sends stage priced in one call, each row
    the same arithmetic as its moment alone). Numbers, numpy arrays or PuLP expressions (an ILP
    writes one row per moment)."""
    held = moment.in_flight * kept
    # split backwards only (every other plan's arithmetic stays as it was); a running I stores wgrads as it goes
    held = _where(moment.running_i | (moment.pending_w != 0), held, lambda: [moment.pending_w * wgrad, 1 * moment.running_i * running])
    held = _where(moment.running_w, held, lambda: [w_work])
    held = _where(moment.warmup_send, held, lambda: [output])
    # ended I; of them, sent_grads - pending_w also ended their W
    held = _where(moment.sent_grads != 0, held, lambda: [moment.sent_grads * sent[0], (moment.sent_grads - moment.pending_w) * sent[1],
                                                         moment.pending_w * (sent[2] - held_out)])
    held = _where(moment.transient, held, lambda: [transient])
    return _where(np.logical_not(moment.gradients), held, lambda: [gradients], sign=-1)


def _where(flag: Any, held: Any, terms: Callable[[], list[Any]], sign: int = 1) -> Any:
    """`held` plus (sign -1: minus) each of `terms()` in turn where `flag` holds: a bool, or a
    MomentStack's column of flags, where np.where keeps each row the arithmetic of its moment alone
    (a moment without the term never adds a zero, so plans stay byte-identical)."""
    def total() -> Any:
        out = held
        for term in terms():
            out = out + term if sign > 0 else out - term
        return out
    if isinstance(flag, np.ndarray):
        return held if not flag.any() else total() if flag.all() else np.where(flag, total(), held)
    return total() if flag else held


def stage_bytes(static: Any, bytes_in: Any, bytes_out: Any, in_flight: Any, kept: Any, transient: Any,
                optimizer_step: float = 0.0, n_microbatches: int | None = None, batch_in: Any = 0.0,
                gradients: Any = 0.0, moments: Sequence[Any] | None = None, wgrad: Any = 0.0,
                sent: tuple[Any, Any, Any] = (0.0, 0.0, 0.0), held_out: Any = 0.0, running: Any = 0.0,
                w_work: Any = 0.0) -> Any:
    """Peak bytes of a stage: fixed_bytes + the largest moment_bytes over `moments` (planner.
    schedules.memory.stage_memory_moments) and the optimizer step's temporaries (module docstring).
    Buffers: buffer_bytes(bytes_in, bytes_out, n_microbatches, batch_in); `gradients` the stage's
    gradient bytes (part of `static`); `wgrad` what it holds per pending W (stage_wgrad), `sent` what
    its sends and pending W hold (sent_bytes), `held_out` its held output (held_output), `running`
    what a running I holds beyond the transient (running_i_extra), `w_work` what a split W holds (w_workspace). `moments`
    None: one moment holding `in_flight` micro-batches, the transient and the gradients (the bound
    used before pplan told the moments apart; no pending W).

    Pure arithmetic: numbers, numpy arrays and (with moments None) PuLP expressions all work (a
    PuLP caller charges each moment and the optimizer step as rows of their own: max is not linear).
    """
    if moments is None:
        held = in_flight * kept + transient
        if not (isinstance(optimizer_step, (int, float)) and optimizer_step == 0):
            held = np.maximum(held, optimizer_step)
    else:  # the step (or, without one, the gradients alone) is the floor of every moment
        held = np.maximum(optimizer_step, 0.0)
        for moment in moments:
            held = np.maximum(held, moment_bytes(moment, kept, transient, gradients, wgrad, sent, held_out, running, w_work,
                                                 bytes_out))
    return fixed_bytes(static, bytes_in, bytes_out, n_microbatches, batch_in) + held


def recompute_saving(in_flight: Any, kept_saved: Any, transient: Any) -> Any:
    """Bytes a recompute set saves against no recompute at one moment: in_flight x (kept bytes it
    saves) - its transient (0 for a moment without a backward running). Each moment of
    stage_bytes drops by this with its own count."""
    return in_flight * kept_saved - transient


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak memory of one device, by kind, in bytes."""

    weights: float
    """Parameters."""
    gradients: float
    """Parameter gradients (same size as the weights)."""
    optimizer: float
    """Optimizer state."""
    activations: float
    """Activations at the schedule's peak, recompute transients and layer workspaces included; the
    optimizer step's temporaries instead where those are larger (the step holds no activations)."""
    buffers: float
    """Send/receive buffers at the stage boundaries."""

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.buffers

    def as_dict(self) -> dict[str, int]:
        return {
            "weights": int(self.weights), "gradients": int(self.gradients),
            "optimizer": int(self.optimizer), "activations": int(self.activations),
            "buffers": int(self.buffers), "total": int(self.total),
        }


def stage_memory(stages: list, peak_activation_bytes: float) -> MemoryBreakdown:
    """Peak memory of a device running `stages` (StageCost), given the schedule's peak activation bytes;
    the optimizer state is what each stage's static_bytes holds beyond weights and gradients.

    `peak_activation_bytes` comes from the schedule (in-flight micro-batches x kept bytes,
    plus transients); see planner.schedules.memory.
    """
    params = sum(s.param_bytes for s in stages)
    step = max((s.optimizer_workspace_bytes for s in stages), default=0.0)  # one parameter at a time
    return MemoryBreakdown(
        weights=params,
        gradients=params,
        optimizer=sum(s.static_bytes for s in stages) - 2.0 * params,
        activations=max(peak_activation_bytes, step),
        buffers=sum(s.buffer_bytes for s in stages),
    )
