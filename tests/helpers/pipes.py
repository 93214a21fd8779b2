"""Reading what torch.distributed.pipelining's stages send each other."""

from __future__ import annotations

from typing import Any


def stage_sends(pipe: Any, mb: Any):
    """(S, S) array: the forward bytes stage i sends stage j per micro-batch `mb` in a Pipe
    (torch's pipeline()), read off its split graph."""
    import operator

    import numpy as np
    from torch.fx.passes.shape_prop import ShapeProp

    gm = pipe.split_gm
    ShapeProp(gm).propagate(mb)
    stage_of = {nd: i for i, nd in enumerate(n for n in gm.graph.nodes if n.op == "call_module")}
    sends = np.zeros((len(stage_of), len(stage_of)))
    for nd, dst in stage_of.items():
        for arg in nd.all_input_nodes:
            src = stage_of.get(arg.args[0] if arg.target is operator.getitem else arg)
            if src is not None:
                tm = arg.meta["tensor_meta"]
                sends[src, dst] += tm.shape.numel() * tm.dtype.itemsize
    return sends
