"""Tensor parallelism's share of wgrad_bytes: what one tp rank's I keeps for W, measured on the
block `pplan run` executes (planner.execute.tensor, gloo ranks on CPU), equals the cost model's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from planner.cost.collectives import Link2
from planner.cost.tensor_parallel import tensor_parallel_costs, tp_layers
from planner.profiling.analytic import analytic_profile

ROOT = Path(__file__).resolve().parents[1]
HIDDEN, HEADS, FFN, BATCH, SEQ = 64, 4, 4, 2, 16
SPEC = f"gpt:layers=1,hidden={HIDDEN},heads={HEADS},seq={SEQ},vocab=128,ffn={FFN}"


def rank_hold(rank_text: str, world_text: str, port_text: str, out: str) -> None:
    """One gloo rank (started with text arguments): a tp block's I (torch's stage_backward_input)
    on a replicated input; writes the bytes of the distinct local storages its parameter groups keep for W."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining._backward import stage_backward_input
    from torch.distributed.tensor import DTensor

    from planner.execute.tensor import parallelize_blocks
    from planner.models.gpt import Block

    rank, world = int(rank_text), int(world_text)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port_text}", rank=rank, world_size=world)
    torch.manual_seed(0)
    block = Block(HIDDEN, HEADS, FFN)
    parallelize_blocks([block], init_device_mesh("cpu", (world,)))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, SEQ, HIDDEN, generator=g).requires_grad_()
    dy = torch.randn(BATCH, SEQ, HIDDEN, generator=g)
    _, groups = stage_backward_input([block(x).clone()], [dy], [x], iter(list(block.parameters())))
    held: dict[int, int] = {}
    for group in groups:
        for grads in group.get("grads") or ():
            for t in grads or ():
                if isinstance(t, torch.Tensor):  # a DTensor holds its local shard
                    storage = (t.to_local() if isinstance(t, DTensor) else t).untyped_storage()
                    held[storage.data_ptr()] = max(storage.nbytes(), held.get(storage.data_ptr(), 0))
    Path(out, f"rank{rank}.json").write_text(json.dumps(sum(held.values())))
    dist.barrier()
    os._exit(0)  # gloo's threads can abort interpreter teardown


def _measured(world: int, folder: Path) -> list[int]:
    from planner.execute.launch import free_port
    from planner.warm_start import start_rank_process

    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    port = str(free_port())
    procs = [start_rank_process("test_tp_wgrad:rank_hold", [str(r), str(world), port, str(folder)], env, cwd=ROOT)
             for r in range(world)]
    assert [p.wait(timeout=180) for p in procs] == [0] * world
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize("tp", [2, 4])
def test_a_tp_ranks_wgrad_is_what_the_cost_model_charges(tp, tmp_path):
    pytest.importorskip("torch")
    prof = analytic_profile(SPEC, "cpu", "float32", [BATCH])
    costs = prof.at(BATCH)
    out = BATCH * SEQ * HIDDEN * 4
    assert costs.wgrad_bytes[1] == (7 + FFN) * out  # unsharded, as `pplan profile` measures it
    shared = tensor_parallel_costs(costs, tp_layers(prof.names), tp, Link2(300e9, 0.01))
    measured = _measured(tp, tmp_path)
    assert measured == [4 * out + (3 + FFN) * out // tp] * tp  # ln1, proj, ln2, fc2 whole; qkv, fc1 / T
    assert np.isclose(shared.wgrad_bytes[1], measured[0])
    assert shared.wgrad_bytes[2] == costs.wgrad_bytes[2]  # the head stays whole
