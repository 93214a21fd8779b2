"""What a split backward's W holds while it runs (planner.cost.w_workspace), against the allocator counts
that found it: torch's stage_backward_weight, run alone on a stage with its gradients present, peaked
32.0 MiB above its start on two 2048-wide Linears (16 MiB of weight gradient each), 2.0 MiB on gpt
blocks of hidden 256 (their two FFN matrices, 1 MiB each) and 8.0 MiB on the LM head (8,192 x 256).
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.problems import column_problem

from planner.cost.w_workspace import stage_w_workspace
from planner.partition.dp import StageTables
from planner.schedules import generate
from planner.schedules.memory import memory_peaks, stage_memory_moments

MIB = 2.0 ** 20


def test_two_linears_hold_both_fresh_weight_gradients():
    # mlp layers fc3, fc4 (one Linear each) and a small head: fc4's W runs while fc3's tuple is held
    ws, carry = [16 * MIB, 16 * MIB, 0.08 * MIB], [16 * MIB, 16 * MIB, 0.08 * MIB]
    assert stage_w_workspace([0.0] + ws, [0.0] + carry, 1, 4) == 32 * MIB
    assert stage_w_workspace([0.0] + ws, [0.0] + carry, 1, 2) == 16 * MIB  # one layer: its own


def test_a_stage_starts_without_a_carry_and_layers_without_parameters_pass_it_on():
    ws, carry = [9.0, 5.0, 0.0, 5.0], [9.0, 4.0, 0.0, 4.0]
    assert stage_w_workspace(ws, carry, 1, 4) == 9.0  # layer 3 runs beside layer 1's last group, across layer 2
    assert stage_w_workspace(ws, carry, 2, 4) == 5.0  # layer 1 is on the stage before
    assert stage_w_workspace(ws, carry, 0, 4) == 0.0  # the first stage's W is a whole backward
    assert stage_w_workspace(None, carry, 1, 4) == 0.0  # not measured: nothing charged, as before
    assert stage_w_workspace(ws, None, 1, 4) == 5.0


@pytest.mark.parametrize("seed", range(8))
def test_the_dp_table_prices_the_w_as_the_scalar_rule_does(seed):
    rng = np.random.default_rng(seed)
    L = int(rng.integers(2, 10))
    ws = rng.integers(0, 60, L).astype(float) * 1.25
    carry = None if seed % 3 == 0 else np.where(rng.random(L) < 0.3, 0.0, rng.integers(0, 40, L) * 0.75)
    p = column_problem(L, w_workspace_bytes=ws, w_carry_bytes=carry)
    table = StageTables(p).wwork
    for i in range(L + 1):
        for j in range(i + 1, L + 1):
            assert table[i, j] == stage_w_workspace(ws, carry, i, j), (i, j)  # the same float, not merely close


def test_zero_bubble_moments_have_a_running_w_past_the_first_stage_only():
    sched = generate("zb", 3, 6)
    moments = stage_memory_moments(sched)
    assert not any(m.running_w for m in moments[0])
    assert all(any(m.running_w for m in stage) for stage in moments[1:])
    assert not any(m.running_w for stage in stage_memory_moments(generate("1f1b", 3, 6)) for m in stage)


def test_the_w_workspace_raises_a_peak_at_a_w_and_nowhere_else():
    sched = generate("zb", 2, 4)
    kept, trans, grad = [10.0, 10.0], [1.0, 1.0], [100.0, 100.0]
    base = memory_peaks(sched, kept, trans, grad, wgrad_bytes=[2.0, 2.0])
    assert memory_peaks(sched, kept, trans, grad, wgrad_bytes=[2.0, 2.0], w_workspace_bytes=[0.0, 0.0]) == base
    big = memory_peaks(sched, kept, trans, grad, wgrad_bytes=[2.0, 2.0], w_workspace_bytes=[500.0, 500.0])
    assert big[0] == base[0]  # the first stage's W is a whole backward: no W workspace there
    act, g = big[1]
    assert g == 100.0 and act >= 500.0  # the last rank peaks during a W, with its gradients


def test_a_stages_first_w_of_the_step_holds_no_fresh_gradients_beyond_its_own():
    # torch's first W assigns its fresh gradients as .grad (they are the gradients, charged from its
    # start); only a later W adds into them. One micro-batch: every W is a first W.
    assert not any(m.running_w for stage in stage_memory_moments(generate("zb", 3, 1)) for m in stage)
    kept, trans, grad = [10.0, 10.0], [1.0, 1.0], [100.0, 100.0]
    one = generate("zb", 2, 1)
    base = memory_peaks(one, kept, trans, grad, wgrad_bytes=[2.0, 2.0])
    assert memory_peaks(one, kept, trans, grad, wgrad_bytes=[2.0, 2.0], w_workspace_bytes=[500.0, 500.0]) == base
    # two micro-batches: the last stage's second W adds in, holding the workspace beside its own
    # micro-batch (kept 10, its wgrad 2 until W ends)
    two = generate("zb", 2, 2)
    act, g = memory_peaks(two, kept, trans, grad, wgrad_bytes=[2.0, 2.0], w_workspace_bytes=[500.0, 500.0])[1]
    assert g == 100.0 and act == 10.0 + 2.0 + 500.0
