"""One rank's random state and checkpoint: its seeds, every generator's state, and the rank's
part of a save (every rank writes full tensors) and of a resume.

Random numbers: after the model is built, each rank seeds torch (CPU and CUDA), numpy and
Python's `random` from (plan seed, rank) (rank_seed), so dropout and any other randomness in the
model draw the same numbers in every run of the plan; checkpoints save and restore all of these
states, so a resumed run continues the uninterrupted one bit for bit.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from planner.errors import PplanError
from planner.execute import checkpoint as ckpt
from planner.execute import tensor, zero
from planner.execute.options import RunOptions
from planner.plan import Plan

__all__ = ["rank_seed", "seed_rank", "rng_state", "set_rng_state", "resume_rank", "save_rank"]


def rank_seed(plan_seed: int, rank: int) -> int:
    """The seed of rank `rank`'s random number generators in a run of a plan with `plan_seed`."""
    digest = hashlib.sha256(f"pplan-rank-seed:{plan_seed}:{rank}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def seed_rank(plan_seed: int, rank: int) -> None:
    """Seed torch (and CUDA), numpy and Python's random for this rank."""
    import numpy as np

    s = rank_seed(plan_seed, rank)
    torch.manual_seed(s)  # seeds every CUDA device too
    np.random.seed(s)
    random.seed(s)


def rng_state(device: torch.device) -> dict[str, Any]:
    """Every random generator's state, as tensors and plain data (loadable with weights_only)."""
    import numpy as np

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, py_gauss = random.getstate()
    out: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": {"version": int(version), "state": [int(x) for x in internal], "gauss": py_gauss},
    }
    if device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Restore what rng_state saved (a checkpoint of an older pplan holds only torch's)."""
    import numpy as np

    if isinstance(state, torch.Tensor):  # the old layout: torch's CPU state alone
        torch.set_rng_state(state)
        return
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        n = state["numpy"]
        np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    if "python" in state:
        p = state["python"]
        random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def resume_rank(plan: Plan, opts: RunOptions, pipe: Any, opt: Any, rank: int, device: torch.device,
                resume: dict[str, Any] | None, say: Callable[[str], None]) -> tuple[int, dict[int, float]]:
    """(first step, losses logged so far): from `resume` ({"step": k, "folder": path}, chosen once
    by run_plan), else from the newest intact save in opts.checkpoint_dir; (0, {}) without one.
    Loads this rank's weights (its shards under ZeRO-2/3 or tp), optimizer and random state;
    the last stage's first rank `say`s where it resumed from."""
    start_step: int = 0
    loss_log: dict[int, float] = {}
    if not opts.checkpoint_dir:
        return start_step, loss_log
    mods, is_last = pipe.modules, pipe.is_last
    if resume is not None:
        found = (int(resume["step"]), Path(resume["folder"])) if resume.get("folder") else None
    else:
        found = ckpt.latest_checkpoint(opts.checkpoint_dir, plan)
    if found is not None:
        start_step, folder = found
        source = ckpt.rank_file_for(folder, rank, pipe.pp_index, dp_index=pipe.dp_index, tp_index=pipe.tp_index,
                                    n_devices=plan.n_devices)
        state = ckpt.load_rank_file(folder, source)
        try:
            for m in mods:
                for i, layer in enumerate(m.layers):
                    tensor.load_layer_state(layer, state["layers"][m.first + i])  # ZeRO-2/3, tp: this rank's shards
            if pipe.tp > 1:  # saved in the model's row order, full: each tp rank keeps its part
                tensor.load_optimizer_state(opt, state["optimizer"], pipe)
            else:
                zero.load_optimizer_state(opt, state["optimizer"])
            if source == rank:  # a new replica keeps its own random stream (seed_rank above)
                set_rng_state(state["rng"], device)
            loss_log = {int(k): v for k, v in state.get("losses", {}).items()}
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            text = " ".join(str(e).split())[:200]
            raise PplanError(f"checkpoint file {folder / f'rank{source}.pt'} does not fit this plan's stages: "
                             f"{type(e).__name__}: {text}", "use another --checkpoint-dir") from None
        if is_last and pipe.dp_index == 0 and pipe.tp_index == 0:
            say(f"resuming from {folder} (step {start_step})")
    return start_step, loss_log


def save_rank(root: str, step: int, rank: int, world: int, pipe: Any, opt: Any, losses: dict, device: torch.device) -> None:
    """Every rank writes its file: full tensors in the model's layout, under ZeRO gathered over the
    replicas, under tensor parallelism over the tp ranks (collective)."""
    plan, mods = pipe.plan, pipe.modules
    if rank == 0:
        ckpt.prepare_save(root, step)
    dist.barrier()
    if pipe.tp > 1:  # gathered over the tp ranks, QKV rows back in the model's order (as the weights)
        optim = tensor.full_optimizer_state(opt, pipe)
    else:
        optim = zero.full_optimizer_state(opt, pipe) if pipe.zero else opt.state_dict()
    state = {
        "step": step,
        "layers": {m.first + i: tensor.full_layer_state(layer) for m in mods for i, layer in enumerate(m.layers)},
        "optimizer": optim,
        "rng": rng_state(device),
        "losses": {str(k): v for k, v in losses.items()},
    }
    ckpt.save_rank_file(root, step, rank, state)
    dist.barrier()
    if rank == 0:
        ckpt.finish_save(root, step, plan, world)
    dist.barrier()
