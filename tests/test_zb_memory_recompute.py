"""What a recomputed layer keeps besides its input (profile column checkpoint_extra_bytes).

torch.utils.checkpoint saves the RNG state at every call, and the pipeline runtime computes the
loss outside the stage, so a checkpointed last layer still leaves the loss's saved tensors (the
log-probabilities of a cross-entropy) alive from forward to backward of every micro-batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from helpers.plans import three_layer_profile
from planner.cost import stage_cost
from planner.cost.memory import checkpoint_input_bytes
from planner.profiling.measure import measure_layer
from planner.profiling.saved import checkpoint_extra_bytes


def test_checkpoint_keeps_its_rng_state_and_the_loss_its_saved_tensors():
    rng = torch.get_rng_state().nbytes
    logits, labels = torch.randn(3, 5), torch.tensor([0, 1, 2])
    assert checkpoint_extra_bytes(logits) == rng  # an inner layer: the RNG state alone
    # cross-entropy keeps its log-probabilities (3 x 5 floats) at least; the labels it saves are the
    # step's batch, which the last stage holds anyway (planner.cost.batch): not counted here
    assert checkpoint_extra_bytes(logits, F.cross_entropy, labels) - rng >= 3 * 5 * 4
    # a mean-squared error keeps its input (the stage output) and the target, which is the batch's
    assert checkpoint_extra_bytes(logits, F.mse_loss, torch.randn(3, 5)) - rng == 3 * 5 * 4


def _profile(extra: list[int] | None):
    return three_layer_profile(None if extra is None else {"checkpoint_extra_bytes": extra}, {"input_bytes_per_sample": "10"})


def test_recomputed_layers_are_charged_what_they_keep_besides_their_input():
    old, new = _profile(None).at(4), _profile([5, 5, 300]).at(4)
    assert list(checkpoint_input_bytes(old)) == [40.0, 100.0, 100.0]
    assert list(checkpoint_input_bytes(new)) == [45.0, 105.0, 400.0]
    rec_old, rec_new = stage_cost(old, 0, 3, (0, 2)), stage_cost(new, 0, 3, (0, 2))
    assert rec_new.kept_bytes - rec_old.kept_bytes == 5 + 300
    assert stage_cost(new, 0, 3).kept_bytes == stage_cost(old, 0, 3).kept_bytes  # nothing recomputed: unchanged


def test_profiler_measures_the_last_layers_loss_outside_its_checkpoint():
    torch.manual_seed(0)
    x = torch.randn(4, 8, requires_grad=True)
    head = torch.nn.Linear(8, 6)
    m, out, saved = measure_layer(head, x, loss_fn=F.cross_entropy, target=torch.tensor([0, 1, 2, 3]),
                                  warmup=0, repeats=1)
    saved.release()
    extra = checkpoint_extra_bytes(out, F.cross_entropy, torch.tensor([0, 1, 2, 3]))
    # the loss's part is in what the layer saves for backward, and a checkpoint of the layer does not cover it
    assert 4 * 6 * 4 <= extra - torch.get_rng_state().nbytes <= m.activation_bytes
