"""What a split backward's I frees and stores, against the per-action allocator counts that found them.

The figures are the ones torch's CPU allocator reported per action (gpt, hidden 256, vocabulary
8,192, micro-batches of 8, zero bubble on 3 ranks; planner.cost.held's docstring): blocks of 5 MiB
workspace and 11 MiB wgrad, an LM head of 64 MiB workspace (the logits' gradient in it) and 33 MiB
wgrad whose loss saves 32 MiB of log-probabilities.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.problems import column_problem

from planner.cost.held import loss_saved_bytes, pending_output, running_i_extra, sent_bytes
from planner.partition.dp import StageTables
from planner.profiling.profile import make_profile

MIB = 2.0 ** 20
BLOCK_WS, BLOCK_WGRAD = 5 * MIB, 11 * MIB
HEAD_WS, HEAD_WGRAD = 64 * MIB, 33 * MIB


def _model(n_blocks: int) -> tuple[list[float], list[float]]:
    """(workspace, wgrad) per layer of an embedding, n blocks and the head."""
    return ([8 * MIB] + [BLOCK_WS] * n_blocks + [HEAD_WS], [0.0] + [BLOCK_WGRAD] * n_blocks + [HEAD_WGRAD])


def test_a_middle_stage_of_blocks_holds_their_wgrads_not_wgrads_plus_workspace():
    ws, wg = _model(6)
    # blocks 2..4 on a middle rank: measured 33 MiB above the forward's end during I (+ the 1 MiB
    # input gradient its end-of-I state holds), where transient + one wgrad was 5 + 33
    extra = running_i_extra(ws, wg, 3, 6)
    assert BLOCK_WS + extra == 3 * BLOCK_WGRAD


def test_the_head_stores_its_wgrad_inside_its_workspace():
    ws, wg = _model(6)
    assert running_i_extra(ws, wg, 7, 8) == 0.0  # measured: the I peaked at its workspace alone
    assert running_i_extra(ws, wg, 6, 8) == 0.0  # block 5 + head: 33 + max(5, 11) = 44 < 64
    assert running_i_extra(ws, wg, 0, 3) == 0.0  # the first stage's I computes nothing
    assert running_i_extra(ws, None, 3, 6) == 0.0


def test_a_large_workspace_under_later_wgrads_adds_them():
    # the bottom layer's backward runs while the two above it hold theirs: 2 x 10 + 50, above the
    # stage's largest workspace (50) by 20, not by its whole wgrad (30)
    assert running_i_extra([0.0, 50.0, 1.0, 1.0], [0.0, 10.0, 10.0, 10.0], 1, 4) == 20.0


def test_the_loss_tensors_are_the_last_layers_checkpoint_extra_beyond_the_rng_state():
    cols = {"fwd_ms": np.ones((3, 1)), "bwd_ms": np.ones((3, 1)), "param_bytes": np.ones((3, 1)),
            "activation_bytes": np.full((3, 1), 100.0), "output_bytes": np.full((3, 1), 10.0),
            "checkpoint_extra_bytes": np.array([[5056.0], [5056.0], [5056.0 + 32 * MIB]])}
    costs = make_profile(["a", "b", "c"], [8], cols).at(8)
    assert loss_saved_bytes(costs) == 32 * MIB
    del cols["checkpoint_extra_bytes"]
    assert loss_saved_bytes(make_profile(["a", "b", "c"], [8], cols).at(8)) == 0.0


def test_a_pending_w_on_the_last_stage_holds_neither_its_output_nor_the_loss_tensors():
    assert pending_output(32.0, True, 30.0) == -30.0 and pending_output(32.0, False, 30.0) == 32.0
    got = pending_output(np.array([5.0, 7.0]), np.array([False, True]), 3.0)
    assert got.tolist() == [5.0, -3.0]
    assert sent_bytes(1.0, 0.0, 32.0, True, True, 30.0) == (1.0, 0.0, -30.0)


@pytest.mark.parametrize("seed", range(6))
def test_the_dp_tables_price_the_running_i_as_the_scalar_rule_does(seed):
    rng = np.random.default_rng(seed)
    L = int(rng.integers(2, 9))
    ws = None if seed % 3 == 0 else rng.integers(0, 60, L).astype(float) * 1.25
    wg = rng.integers(0, 30, L).astype(float) * 0.75
    p = column_problem(L, workspace_bytes=ws, wgrad_bytes=wg)
    table = StageTables(p).running
    for i in range(L + 1):
        for j in range(L + 1):
            want = running_i_extra(ws, wg, i, j) if j > i else 0.0
            assert table[i, j] == want, (i, j)  # the same float, not merely close
