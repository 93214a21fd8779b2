"""Zero-bubble's W step recomputes each checkpointed layer once, and still gives the gradients of a
full backward (planner.execute.weight_backward).

torch's W differentiates one parameter group at a time; without a shared recompute every group's
call recomputed the layer again, and with the graph retained all of them stayed alive until W
ended. Layers here have several parameter groups, and one reads its input with three separate
projections (the q/k/v of a Llama attention), the case where groups could share a saved tensor.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils import checkpoint as torch_checkpoint

from planner.execute.stages import Checkpointed


class _Counted(nn.Module):
    """A block with several parameter groups that counts how often its forward runs."""

    def __init__(self, width: int, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.norm = nn.LayerNorm(width)
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.out = nn.Linear(width, width)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        h = self.norm(x)
        return x + self.out(torch.tanh(self.q(h)) * torch.sigmoid(self.k(h)) + self.v(h))


class _Stage:
    """The two attributes of a torch PipelineStage that the W wrapper reads and replaces."""

    def __init__(self, submod: nn.Module):
        self.submod = submod
        self.backward_maybe_with_nosync = None


def _blocks() -> list[_Counted]:
    return [_Counted(8, seed) for seed in (1, 2)]


def _loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return (model(x) ** 2).mean()


@pytest.mark.skipif(not hasattr(torch_checkpoint, "GraphExecGroup"),
                    reason="this torch has no GraphExecGroup: W recomputes once per parameter group there")
def test_w_recomputes_each_checkpointed_layer_once_with_full_backward_gradients():
    from torch.distributed.pipelining._backward import stage_backward_input

    from planner.execute.weight_backward import retain_graph_in_weight_backward

    inputs = [torch.randn(4, 8, generator=torch.Generator().manual_seed(s)) for s in (10, 11)]
    reference = nn.Sequential(*_blocks())
    for x in inputs:  # a full backward per micro-batch, accumulated
        _loss(reference, x.clone().requires_grad_()).backward()

    blocks = _blocks()
    model = nn.Sequential(*(Checkpointed(b) for b in blocks))
    stage = _Stage(model)
    retain_graph_in_weight_backward([stage])
    pending = []
    for x in inputs:  # I for both micro-batches, then W for both, as zb orders them
        h = x.clone().requires_grad_()
        pending.append(stage_backward_input([_loss(model, h)], None, [h], model.parameters())[1])
    before_w = [b.calls for b in blocks]  # forward + the recompute of I, per micro-batch
    for groups in pending:
        stage.backward_maybe_with_nosync("weight", {"param_groups": groups})

    # one more recompute per micro-batch (a block has several parameter groups: one each before)
    assert [b.calls - c for b, c in zip(blocks, before_w)] == [len(inputs)] * len(blocks)
    for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7, msg=lambda m, n=n: f"{n}: {m}")
