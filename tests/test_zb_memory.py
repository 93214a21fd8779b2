"""Zero bubble's pending weight gradients: what a micro-batch holds between its I and its W.

torch's split backward (stage_backward_input) keeps, for the W that follows, the gradients at the
nodes where the weights' paths meet the input's; a zero-bubble rank that defers W holds them for
every micro-batch whose I ran and W did not. The profile measures them per layer (`wgrad_bytes`),
the schedule counts the pending micro-batches at each memory moment (Moment.pending_w), and
planner.cost.memory prices them for every solver and the simulator.
"""

from __future__ import annotations

import pytest
import torch

from helpers.plans import three_layer_profile
from planner.cost import stage_cost, stage_peak_bytes
from planner.cost.held import stage_wgrad, wgrad_unmeasured_note
from planner.profiling.measure import measure_layer
from planner.profiling.profile import profile_from_bytes, profile_to_text
from planner.schedules import generate
from planner.schedules.memory import Moment, memory_peaks, stage_memory_moments


def test_zero_bubble_moments_count_pending_weight_gradients():
    # rank 1: 1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1F3 1I3 1W2 1W3: during 1W2 micro-batches 2 and 3 are
    # held, neither W has ended, and all four I have sent their input gradients; during 1I3 its own
    # wgrad is alive already (running_i); during 1W2 and 1W3 their fresh weight gradients (running_w);
    # after 1W3 the sends still hold all four (no micro-batch).
    # Rank 0 (0F0 0F1 0I0 0W0 0F2 0I1 0W1 0F3 0I2 0W2 0I3 0W3) runs its backward, the transient, at W
    got = stage_memory_moments(generate("zb", 2, 4))
    assert got == [
        (Moment(0, False, True, 0, 4), Moment(1, False, True, 0, 3, True), Moment(2, False, True, 0, 2, True),
         Moment(1, True, True, 1, 4), Moment(2, True, True, 1, 3)),
        (Moment(0, False, True, 0, 4), Moment(1, False, True, 1, 4, False, True), Moment(2, False, True, 2, 4, False, True),
         Moment(2, True, True, 1, 3, True)),
    ]
    for name in ("gpipe", "1f1b"):  # no split backward: nothing pending, nothing held after its send
        assert all(m.pending_w == m.sent_grads == 0 for kinds in stage_memory_moments(generate(name, 2, 4)) for m in kinds)


def test_memory_peaks_hold_pending_weight_gradients_until_w_ends():
    sched = generate("zb", 2, 4)
    # 10 bytes kept per micro-batch, 100 held between I and W on stage 1: at 1W0 two micro-batches
    # are held and both are pending
    peaks = memory_peaks(sched, [10.0, 10.0], [0.0, 0.0], [0.0, 0.0], None, [0.0, 100.0])
    assert peaks == [(20.0, 0.0), (220.0, 0.0)]
    # and 1 byte per input gradient sent: at 1W2 all four are held
    sent = [(0.0, 0.0, 0.0), (1.0, 0.0, 0.0)]
    assert memory_peaks(sched, [10.0, 10.0], [0.0, 0.0], [0.0, 0.0], None, [0.0, 100.0], sent)[1] == (224.0, 0.0)
    # rank 0 sends its output on: 1000 bytes per micro-batch whose W ended, until the step ends (after
    # 0W3, its last action: all 4 of them, and no micro-batch held)
    got = memory_peaks(sched, [10.0, 10.0], [0.0, 0.0], [0.0, 0.0], None, None, [(0.0, 1000.0, 0.0), (0.0, 0.0, 0.0)])
    assert got[0] == (4000.0, 0.0)
    # a running I stores its wgrads as it goes (torch's hooks), priced beyond the transient by `running`
    # (planner.cost.held.running_i_extra): rank 1 of 1F0 1I0 1W0 peaks during 1I0, its output (10 of
    # the 10 kept) still held, at 10 + 100, not at 1W0 (100); with nothing running beyond the
    # transient it peaks after I instead (100 pending, its output freed)
    one = generate("zb", 2, 1)
    assert memory_peaks(one, [10.0, 10.0], [0.0, 0.0], [0.0, 0.0], [10.0, 10.0], [0.0, 100.0], None, [0.0, 100.0])[1] == (110.0, 0.0)
    assert memory_peaks(one, [10.0, 10.0], [0.0, 0.0], [0.0, 0.0], [10.0, 10.0], [0.0, 100.0])[1] == (100.0, 0.0)
    # the first stage's backward runs at W (its I computes no input gradient): the transient lives then
    # with the pending wgrad priced here (10 + 5 + 100), not during I (10 + 5, or 10 + 100 with I's wgrad)
    assert memory_peaks(generate("zb", 1, 1), [10.0], [5.0], [0.0], None, [100.0])[0] == (115.0, 0.0)
    assert memory_peaks(sched, [10.0, 10.0], [0.0, 0.0], [0.0, 0.0]) == [(20.0, 0.0), (20.0, 0.0)]
    # a split W makes the stage's gradients before its micro-batch's activations go: rank 1 of
    # 1F0 1I0 1W0 peaks during 1W0 at 10 + 7; the first stage's W is a whole backward, which frees
    # as it makes them: rank 0 peaks before, at 10 (its 5 bytes of gradients come after)
    assert memory_peaks(generate("zb", 2, 1), [10.0, 10.0], [0.0, 0.0], [5.0, 7.0]) == [(10.0, 0.0), (10.0, 7.0)]


def _profile(wgrad: list[int] | None):
    return three_layer_profile(None if wgrad is None else {"wgrad_bytes": wgrad})


def test_stage_memory_prices_pending_weight_gradients():
    costs = _profile([7, 30, 50]).at(4)
    first, last = stage_cost(costs, 0, 1), stage_cost(costs, 1, 3)
    assert (first.wgrad_bytes, last.wgrad_bytes) == (0.0, 80.0)  # torch's first stage runs all its backward at W
    kinds = stage_memory_moments(generate("zb", 2, 4))
    plain = stage_cost(_profile(None).at(4), 1, 3)
    # stage 1's moments: 2 held + 2 pending, or 2 held + 1 pending with a backward running (no transient here) ...
    assert last.sent == (100.0, 0.0, 0.0) and plain.sent == (0.0, 0.0, 0.0)  # the input gradient, with the column only
    assert first.sent == (0.0, 100.0, 0.0)  # the first stage sends its output on
    # ... and the four input gradients its I actions sent, held until the step ends
    assert stage_peak_bytes(last, 2, kinds[1]) - stage_peak_bytes(plain, 2, kinds[1]) == 160.0 + 4 * 100.0
    assert stage_wgrad(None, 1, 3) == 0.0


def test_a_profile_without_the_column_loads_and_says_so_for_zero_bubble():
    old = _profile(None)
    assert "wgrad_bytes" not in profile_to_text(old)
    costs = profile_from_bytes(profile_to_text(old).encode(), "old.csv").at(4)
    assert costs.wgrad_bytes is None
    assert "wgrad_bytes" in wgrad_unmeasured_note(costs, split_backward=True)
    assert wgrad_unmeasured_note(costs, split_backward=False) is None
    # interleaved holds its sends to the step's end, which the cost model charges only with the column
    assert "sends hold" in wgrad_unmeasured_note(costs, split_backward=False, sends_held=True)
    new = profile_from_bytes(profile_to_text(_profile([7, 30, 50])).encode(), "new.csv").at(4)
    assert list(new.wgrad_bytes) == [7.0, 30.0, 50.0]
    assert wgrad_unmeasured_note(new, split_backward=True) is None


def test_profiler_measures_what_input_backward_keeps_for_weight_backward():
    torch.manual_seed(0)
    x = torch.randn(3, 4, requires_grad=True)
    linear, _, _ = measure_layer(torch.nn.Linear(4, 8), x, warmup=0, repeats=1)
    assert linear.wgrad_bytes == 3 * 8 * 4  # the gradient of the Linear's output, which W multiplies by its input
    relu, _, _ = measure_layer(torch.nn.ReLU(), x, warmup=0, repeats=1)
    assert relu.wgrad_bytes == 0  # no parameters: no W
    first, _, _ = measure_layer(torch.nn.Linear(4, 8), torch.randn(3, 4), warmup=0, repeats=1)
    assert first.wgrad_bytes == 0  # an input without gradient: torch runs the whole backward at W


@pytest.mark.parametrize("size", [2, 6])
def test_profiler_column_scales_with_the_micro_batch(size):
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    m, _, _ = measure_layer(block, torch.randn(size, 4, requires_grad=True), warmup=0, repeats=1)
    assert m.wgrad_bytes == size * (16 + 4) * 4  # both Linears' output gradients


def test_a_profiled_model_has_both_columns():
    from planner.profiling.profiler import profile_model

    costs = profile_model("gpt:layers=1,hidden=16,heads=2,seq=8,vocab=32", [2], warmup=0, repeats=1, timer="wall").at(2)
    wgrad, extra = list(costs.wgrad_bytes), list(costs.checkpoint_extra_bytes)
    assert wgrad[0] == 0 and all(w > 0 for w in wgrad[1:])  # the embedding's input needs no gradient
    rng = torch.get_rng_state().nbytes
    assert extra[:-1] == [rng] * (len(extra) - 1)
    assert extra[-1] >= rng + 2 * 8 * 32 * 4  # the loss keeps the log-probabilities of 2 x 8 tokens over 32 words
