"""fp32 master weights of a 16-bit plan (planner.master_weights): the mixed-precision training the
cost model prices (planner/cost/precision.py: 2 B weights + 2 B gradients + 12 B fp32 masters and
Adam state per parameter), not pure bf16 Adam, which drops updates under half a bf16 step.

Single process, no torch.distributed: the optimizer classes `pplan run` builds (stages.make_optimizer),
their checkpoint layout, and a ZeRO-2/3 optimizer (fp32 shards) taking a saved master as its weight.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from planner.master_weights import MASTER_KEY, with_fp32_masters
from planner.execute.stages import make_optimizer
from planner.execute.zero import load_optimizer_state


def _model(dtype: torch.dtype, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers = [nn.Linear(8, 8) for _ in range(5)]  # 10 parameters: the step runs in several chunks
    return nn.Sequential(*[m for layer in layers for m in (layer, nn.Tanh())]).to(dtype)


def _grads(model: nn.Module, step: int) -> None:
    """One backward of a fixed batch of step `step` in the model's own dtype."""
    gen = torch.Generator().manual_seed(100 + step)
    dtype = next(model.parameters()).dtype
    x = torch.randn(4, 8, generator=gen).to(dtype)
    model(x).square().mean().backward()


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd", "sgd-plain"])
def test_a_master_step_equals_a_float32_step_on_the_same_weights(name):
    bf16 = _model(torch.bfloat16)
    ref = copy.deepcopy(bf16).float()  # float32 weights equal to the bf16 ones
    opt, ref_opt = make_optimizer(name, list(bf16.parameters()), 1e-2), make_optimizer(name, list(ref.parameters()), 1e-2)
    assert type(opt).__name__.startswith("FP32Master") and not type(ref_opt).__name__.startswith("FP32Master")
    for step in range(4):
        _grads(bf16, step)
        for p, r in zip(bf16.parameters(), ref.parameters()):
            r.grad = p.grad.float()  # the same gradients, in float32
        opt.step()
        ref_opt.step()
        opt.zero_grad(set_to_none=True)
        ref_opt.zero_grad(set_to_none=True)
        for p, r in zip(bf16.parameters(), ref.parameters()):
            torch.testing.assert_close(opt.state[p][MASTER_KEY], r.detach(), rtol=0, atol=0)  # the same fp32 arithmetic
            assert torch.equal(p.detach(), r.detach().to(torch.bfloat16))  # the weight is the master's rounding
            assert p.dtype == torch.bfloat16


@pytest.mark.parametrize("name, lr", [("sgd-plain", 1e-3), ("adam", 1e-4)])
def test_an_update_under_half_a_bf16_step_is_kept_in_the_master(name, lr):
    # a weight of 1.0 moves by lr a step: under 2^-9 (half a bf16 step at 1.0), pure bf16 drops it every time
    master_w, pure_w = (nn.Parameter(torch.ones(16, dtype=torch.bfloat16)) for _ in range(2))
    opt = make_optimizer(name, [master_w], lr)
    pure = {"sgd-plain": torch.optim.SGD, "adam": torch.optim.Adam}[name]([pure_w], lr=lr)
    for _ in range(20):
        for w, o in ((master_w, opt), (pure_w, pure)):
            w.grad = torch.ones_like(w)
            o.step()
    assert torch.equal(pure_w.detach(), torch.ones_like(pure_w))  # pure bf16: not one update landed
    master = opt.state[master_w][MASTER_KEY]
    torch.testing.assert_close(master, torch.full((16,), 1.0 - 20 * lr), rtol=0, atol=1e-6)  # every update kept
    assert torch.equal(master_w.detach(), master.to(torch.bfloat16)) and master_w[0].item() < 1.0


def test_the_optimizer_state_of_a_bf16_parameter_is_fp32_and_a_float32_one_has_no_master():
    bf16, fp32 = _model(torch.bfloat16), _model(torch.float32)
    opts = {m: make_optimizer("adam", list(m.parameters()), 1e-3) for m in (bf16, fp32)}
    for m, opt in opts.items():
        _grads(m, 0)
        opt.step()
    for p in bf16.parameters():
        state = opts[bf16].state[p]
        assert sorted(state) == ["exp_avg", "exp_avg_sq", MASTER_KEY, "step"]
        assert {k: v.dtype for k, v in state.items()} == dict.fromkeys(state, torch.float32)
    assert type(opts[fp32]) is torch.optim.Adam  # a float32 plan: torch's class, unchanged
    assert all(MASTER_KEY not in opts[fp32].state[p] for p in fp32.parameters())
    # the master, moments and variance: 12 bytes per parameter, the cost model's optimizer_bytes
    params = sum(p.numel() for p in bf16.parameters())
    held = sum(v.numel() * v.element_size() for s in opts[bf16].state.values() for k, v in s.items() if k != "step")
    assert held == 12 * params


def test_a_step_runs_the_step_hooks_once():
    model = _model(torch.bfloat16)
    opt = make_optimizer("adam", list(model.parameters()), 1e-3)
    calls = []
    opt.register_step_pre_hook(lambda o, args, kwargs: calls.append("pre"))
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append("post"))
    _grads(model, 0)
    opt.step()
    assert calls == ["pre", "post"]  # not once per chunk of parameters


def test_a_save_resumes_from_the_masters_bit_for_bit():
    model = _model(torch.bfloat16)
    opt = make_optimizer("adam", list(model.parameters()), 1e-2)
    for step in range(2):
        _grads(model, step)
        opt.step()
        opt.zero_grad(set_to_none=True)
    saved_weights = copy.deepcopy(model.state_dict())
    saved = copy.deepcopy(opt.state_dict())  # what a checkpoint holds
    for step in (2, 3):
        _grads(model, step)
        opt.step()
        opt.zero_grad(set_to_none=True)

    resumed = _model(torch.bfloat16, seed=1)
    resumed.load_state_dict(saved_weights)
    again = make_optimizer("adam", list(resumed.parameters()), 1e-2)
    again.load_state_dict(saved)
    for p in resumed.parameters():  # torch's load casts state to the parameter's dtype; the masters stay fp32
        assert {v.dtype for v in again.state[p].values()} == {torch.float32}
    for step in (2, 3):
        _grads(resumed, step)
        again.step()
        again.zero_grad(set_to_none=True)
    for p, q in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p][MASTER_KEY], again.state[q][MASTER_KEY])


def test_a_state_without_masters_rederives_them_from_the_weights():
    model = _model(torch.bfloat16)
    pure = torch.optim.Adam(model.parameters(), lr=1e-3)  # a save of a run without masters
    _grads(model, 0)
    pure.step()
    opt = with_fp32_masters(torch.optim.Adam)(model.parameters(), lr=1e-3)
    opt.load_state_dict(pure.state_dict())
    before = [p.detach().float() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    _grads(model, 1)
    opt.step()
    for p, w in zip(model.parameters(), before):
        master = opt.state[p][MASTER_KEY]
        assert master.dtype == torch.float32 and not torch.equal(master, w)  # made from the weight, then stepped
        assert torch.equal(p.detach(), master.to(torch.bfloat16))


def test_an_optimizer_over_fp32_shards_takes_a_saved_master_as_its_weight():
    # ZeRO-2/3 of a bf16 plan steps fp32 master shards: a ZeRO 0/1 save's masters become its weights
    bf16 = _model(torch.bfloat16)
    opt = make_optimizer("adam", list(bf16.parameters()), 1e-2)
    _grads(bf16, 0)
    opt.step()
    saved = copy.deepcopy(opt.state_dict())
    fp32 = copy.deepcopy(bf16).float()  # what loading the saved bf16 layers into fp32 parameters gives
    plain = make_optimizer("adam", list(fp32.parameters()), 1e-2)
    load_optimizer_state(plain, saved)
    for p, q in zip(bf16.parameters(), fp32.parameters()):
        assert torch.equal(q.detach(), opt.state[p][MASTER_KEY])  # the master, not its bf16 rounding
        assert MASTER_KEY not in plain.state[q] and sorted(plain.state[q]) == ["exp_avg", "exp_avg_sq", "step"]


def test_a_saved_master_of_another_shape_is_refused_at_load():
    p = nn.Parameter(torch.randn(4, 3).to(torch.bfloat16))
    opt = with_fp32_masters(torch.optim.Adam)([p], lr=1e-3)
    p.grad = torch.ones_like(p)
    opt.step()
    state = opt.state_dict()
    state["state"][0][MASTER_KEY] = torch.zeros(5)
    fresh = with_fp32_masters(torch.optim.Adam)([nn.Parameter(p.detach().clone())], lr=1e-3)
    with pytest.raises(ValueError, match="shape"):
        fresh.load_state_dict(state)
