"""A stage's input counted once: torch's receive buffers, and what the layers save of their input.

torch's PipelineStage receives every micro-batch's activation (and, on a stage that is not the
last, its gradient) into a buffer of its own, allocated at the first step and kept: M x (bytes in
+ bytes out). The stage's first layer saves that very tensor when it saves its input, and a layer
that saves its input saves what the layer before it saved as output. With the profile column
`input_saved_bytes` the cost model charges each once (planner.cost.memory); without it, the older
model, so old profiles plan as before.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from planner.cost import buffer_bytes, kept_activation_bytes, stage_cost, stage_entry_bytes, stage_peak_bytes
from planner.profiling.measure import measure_layer
from planner.profiling.profile import make_profile

KIB = 1024.0


def _profile(with_input_saved: bool):
    """Three layers: `act` saved each, of which `saved_in` is the layer's input and `shared` the
    part the layer before saved as well; model input 1 KiB per sample."""
    cols = {
        "fwd_ms": np.array([[1.0], [1.0], [1.0]]),
        "bwd_ms": np.array([[2.0], [2.0], [2.0]]),
        "param_bytes": np.array([[100.0], [100.0], [100.0]]),
        "activation_bytes": np.array([[10.0], [20.0], [30.0]]) * KIB,
        "output_bytes": np.array([[4.0], [6.0], [1.0]]) * KIB,
        "shared_input_bytes": np.array([[0.0], [4.0], [6.0]]) * KIB,
    }
    if with_input_saved:
        cols["input_saved_bytes"] = np.array([[1.0], [4.0], [6.0]]) * KIB
    return make_profile(["a", "b", "c"], [1], cols, {"input_bytes_per_sample": "1024"})


def test_a_stage_keeps_what_its_layers_save_once_and_its_input_in_the_receive_buffers():
    costs = _profile(True).at(1)
    assert list(kept_activation_bytes(costs) / KIB) == [10.0, 16.0, 24.0]
    assert list(stage_entry_bytes(costs) / KIB) == [-1.0, 0.0, 0.0]  # shared - saved input: layers b, c save only the shared input
    whole = stage_cost(costs, 0, 3, n_microbatches=4)
    assert whole.kept_bytes / KIB == 10 - 1 + 16 + 24  # the input batch is held whole: not again per micro-batch
    tail = stage_cost(costs, 1, 3, n_microbatches=4)
    assert tail.kept_bytes / KIB == 20 - 4 + 24  # b's input is its receive buffer; c's input is b's saved output
    assert tail.buffer_bytes / KIB == 4 * (4 + 0)  # M receive buffers
    head = stage_cost(costs, 0, 1, n_microbatches=4)
    assert head.buffer_bytes / KIB == 4 * (1 + 4)  # the step's input batch, M gradient receive buffers
    assert stage_peak_bytes(tail, 2) == tail.static_bytes + tail.buffer_bytes + 2 * tail.kept_bytes + tail.transient_bytes


def test_profiles_without_the_column_keep_the_older_model():
    costs = _profile(False).at(1)
    assert list(kept_activation_bytes(costs)) == list(costs.activation_bytes)
    assert stage_entry_bytes(costs) is None
    tail = stage_cost(costs, 1, 3, n_microbatches=4)
    assert tail.kept_bytes / KIB == 20 + 30
    assert tail.buffer_bytes / KIB == 2 * (4 + 0)
    assert tail == stage_cost(costs, 1, 3)  # the micro-batch count changes nothing for them


def test_buffer_bytes_formula():
    assert buffer_bytes(3.0, 5.0) == 16.0
    assert buffer_bytes(3.0, 5.0, 4) == 4 * 8
    assert buffer_bytes(0.0, 5.0, 4, batch_in=2.0) == 4 * 7


@pytest.mark.parametrize("layer,saves_input", [(nn.Linear(8, 8), True), (nn.ReLU(), False)])
def test_the_profiler_measures_what_a_layer_saves_of_its_input(layer, saves_input):
    torch.manual_seed(0)
    x = torch.randn(4, 8, requires_grad=True)
    m, _, saved = measure_layer(layer, x, warmup=0, repeats=1)
    saved.release()
    assert m.input_saved_bytes == (4 * 8 * 4 if saves_input else 0)
    assert m.input_saved_bytes <= m.activation_bytes
