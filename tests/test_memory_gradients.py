"""Gradients exist from a stage's first weight-gradient action: schedules whose activations peak
before any backward do not hold both at once."""

import pytest

from planner.schedules import generate
from planner.schedules.memory import activation_peaks, memory_peaks


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb"])
def test_a_rank_never_holds_more_than_all_its_activations_and_gradients(name):
    sched = generate(name, 3, 6)
    kept, trans, grads = [5.0, 3.0, 2.0], [1.0, 0.0, 4.0], [7.0, 11.0, 13.0]
    bound = activation_peaks(sched, kept, trans)
    for r, (act, g) in enumerate(memory_peaks(sched, kept, trans, grads)):
        assert act <= bound[r] and g <= grads[r]
        assert act + g <= bound[r] + grads[r]


def test_gpipe_holds_every_microbatch_before_any_gradient_exists():
    sched = generate("gpipe", 2, 4)
    # activations dominate: the peak is after the last F, before any B, with no gradients
    assert memory_peaks(sched, [10.0, 10.0], [0.0, 0.0], [1.0, 1.0]) == [(40.0, 0.0), (40.0, 0.0)]
    # gradients dominate: the peak is after the first B, with one micro-batch fewer held
    assert memory_peaks(sched, [1.0, 1.0], [0.0, 0.0], [10.0, 10.0]) == [(3.0, 10.0), (3.0, 10.0)]


def test_one_f_one_b_last_stage_holds_gradients_with_its_next_microbatch():
    sched = generate("1f1b", 2, 4)
    # stage 1 runs F0 B0 F1 B1 ...: after B0 its gradients exist while F1's activations are held
    assert memory_peaks(sched, [1.0, 1.0], [0.0, 0.0], [10.0, 10.0])[1] == (1.0, 10.0)


def test_split_backward_allocates_weight_gradients_at_w():
    sched = generate("zb", 2, 2)
    for act, g in memory_peaks(sched, [1.0, 1.0], [0.0, 0.0], [100.0, 100.0]):
        assert g == 100.0 and act <= 2.0


def test_split_backward_frees_the_held_stage_output_at_i():
    sched = generate("zb", 2, 4)
    kept, held = [10.0, 10.0], [4.0, 4.0]
    whole = memory_peaks(sched, kept, [0.0, 0.0], [0.0, 0.0])
    split = memory_peaks(sched, kept, [0.0, 0.0], [0.0, 0.0], held)
    for (a, _), (b, _) in zip(whole, split):
        assert b <= a
    assert any(b < a for (a, _), (b, _) in zip(whole, split))  # some W runs after its I's output went
    one_f_one_b = generate("1f1b", 2, 4)  # B frees everything at once: the same either way
    assert memory_peaks(one_f_one_b, kept, [0.0, 0.0], [0.0, 0.0], held) == memory_peaks(one_f_one_b, kept, [0.0, 0.0], [0.0, 0.0])
