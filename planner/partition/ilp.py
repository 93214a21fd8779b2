"""The stage-cut problem as a mixed-integer programme (PuLP; HiGHS when installed, else CBC).

Same problem as the DP (planner.partition.problem), written with per-layer variables:

  w[l,s]  binary, 1 iff layer l lies in stage >= s (s = 1..S-1); non-decreasing in l,
          non-increasing in s, w[0,s] = 0, w[L-1,s] = 1. In-stage indicator
          y[l,s] = w[l,s] - w[l,s+1]; stage s starts at layer x iff st[x,s] = w[x,s] - w[x-1,s] = 1.
  r[l]    binary, layer l recomputed (auto: saving layers only; all: fixed 1; none: fixed 0).
  z[l,s]  = y[l,s] AND r[l] (three linear inequalities); transient T[s] >= ws_l y[l,s] + ra_l z[l,s]
          for every l (ws_l: layer l's workspace, 0 without the column; ra_l what its recompute
          brings back, problem.rematerialized): one layer's backward at a time holds its workspace
          and, recomputed, its activations again (planner.cost.transient).
  Optimizer step: static + buffers + OW[s] <= budget_s, OW[s] >= ow_l y[l,s] (when the profile measured it).
  Held output: kept also counts the stage's output the runtime holds, sum_x st[x,s+1] ho_(x-1)
          (the last stage: ho_(L-1)), when the profile says which outputs layers save; a pending W
          holds it as planner.cost.held.pending_output says (every stage but the last).
  Entry: kept also counts sum_x st[x,s] en_x (stage 0: en_0), the first layer's correction
          (planner.cost.stage_entry_bytes), when the profile says what layers save of their input.
  Family: for consecutive saving layers e < e', r[e'] <= r[e] + (cuts in (e, e']), so in each
          stage the recomputed saving layers are a prefix of its saving layers.
  Memory  one row per moment of planner.cost.stage_bytes: fixed_bytes(static = sum_l y static,
          bytes in, bytes out) + moment_bytes(moment, kept, transient, sum_l y grad) <= budget_s
          (c kept, + transient if a backward runs then, - gradients if they do not exist yet), and
          fixed bytes alone (the floor: the step without temporaries), where
          kept = sum_l y a - sum_l z (a - in) + sum_e bytes_e h[e,s], transient = T[s]
  h[e,s]  >= 1 - sum of y[l,s] over layers l outside e's gaps (l <= src, l >= dst or a reader),
          >= 0: stage s holds skip tensor e it only forwards (non-chain models; none for a chain)
  Time    t_s = planner.cost.stage_time_ms(sum_l y c, sum_l z rc, speed_s, overhead_s, sends) <= Z

Pass 1 minimises Z; pass 2 bounds every t_s by the optimal Z and minimises sum_s t_s, as the DP
does. Memory rows are scaled by the budget and tightened by 1e-6 so a solution within the
solver's tolerance still fits exactly. O(L*S) variables: for verification and extensions; the
DP is faster at every size (docs/planner.md has the timings).
"""

from __future__ import annotations

import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.cost import fixed_bytes, stage_batch_bytes, moment_bytes, stage_bytes, stage_time_ms, transfer_ms
from planner.cost.held import sent_bytes
from planner.errors import PplanError
from planner.partition.problem import PartitionProblem, Solution, evaluate, moments, rematerialized, saving_layers

__all__ = ["solve_ilp", "ilp_solver_name"]

_TIGHTEN = 1e-6
_PASS2_TOL = 1e-7


def ilp_solver_name() -> str:
    """'HiGHS' when highspy is importable by PuLP, else 'CBC'."""
    import pulp

    return "HiGHS" if "HiGHS" in pulp.listSolvers(onlyAvailable=True) else "CBC"


def _solver(time_limit: float):
    import pulp

    if ilp_solver_name() == "HiGHS":
        return pulp.getSolver("HiGHS", msg=False, timeLimit=time_limit, threads=1)
    with warnings.catch_warnings():  # PuLP 3.3 deprecates the bundled CBC; it is still the one that needs no install
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, threads=1)


def _var(prob, name: str, low: float | None = None, up: float | None = None, cat: str = "Continuous"):
    """A variable attached to `prob` (PuLP >= 3.3's API, plain LpVariable before it)."""
    import pulp

    if hasattr(prob, "add_variable"):
        return prob.add_variable(name, lowBound=low, upBound=up, cat=cat)
    return pulp.LpVariable(name, lowBound=low, upBound=up, cat=cat)


def _send(p: PartitionProblem, boundary: int, nbytes: float) -> float:
    return transfer_ms(nbytes, p.link_latency_ms[boundary], p.link_ms_per_byte[boundary])


@dataclass(frozen=True)
class _Cuts:
    """The cut variables: w[l, s] = 1 when layer l lies in stage s or later (s = 1..S-1)."""

    w: dict
    S: int

    def W(self, l: int, s: int):
        return 1 if s == 0 else (0 if s == self.S else self.w[l, s])

    def y(self, l: int, s: int):
        """1 when layer l is in stage s."""
        return self.W(l, s) - self.W(l, s + 1)

    def st(self, x: int, s: int):
        """1 when stage s (>= 1) starts at layer x (>= 1)."""
        return self.w[x, s] - self.w[x - 1, s]


def _cut_variables(prob, L: int, S: int) -> _Cuts:
    """Cut variables with contiguity: stages in order, each at least one layer."""
    import pulp

    w = {(l, s): _var(prob, f"w_{l}_{s}", cat="Binary") for l in range(L) for s in range(1, S)}
    cuts = _Cuts(w, S)
    for s in range(1, S):
        prob += w[0, s] == 0
        prob += w[L - 1, s] == 1
        for l in range(L - 1):
            prob += w[l, s] <= w[l + 1, s]
        if s + 1 < S:
            for l in range(L):
                prob += w[l, s + 1] <= w[l, s]
    for s in range(S):
        prob += pulp.lpSum(cuts.y(l, s) for l in range(L)) >= 1
    return cuts


def _recompute_variables(prob, p: PartitionProblem, cuts: _Cuts) -> tuple[list[int], dict, dict]:
    """(candidate layers, r[l] = 1 when l is recomputed, z[l, s] = r[l] and l in stage s)."""
    import pulp

    L, S = p.n_layers, p.n_stages
    if p.recompute == "auto":
        cand = [int(l) for l in np.flatnonzero(saving_layers(p))]
    elif p.recompute == "all":
        cand = list(range(L))
    else:
        cand = []
    r = {l: (_var(prob, f"r_{l}", cat="Binary") if p.recompute == "auto" else 1) for l in cand}
    z = {}
    for l in cand:
        for s in range(S):
            if p.recompute == "all":
                z[l, s] = cuts.y(l, s)
                continue
            v = _var(prob, f"z_{l}_{s}", 0, 1)
            prob += v <= cuts.y(l, s)
            prob += v <= r[l]
            prob += v >= cuts.y(l, s) + r[l] - 1
            z[l, s] = v
    if p.recompute == "auto":
        for e, e2 in zip(cand, cand[1:]):
            cuts_between = pulp.lpSum(cuts.st(x, s) for x in range(e + 1, e2 + 1) for s in range(1, S))
            prob += r[e2] <= r[e] + cuts_between
    return cand, r, z


def _stage_time(prob, p: PartitionProblem, cuts: _Cuts, s: int, cand: list[int], z: dict):
    """Stage s's time per micro-batch (an expression), after adding its memory constraint."""
    import pulp

    L, S, y, st = p.n_layers, p.n_stages, cuts.y, cuts.st
    a = np.asarray(p.activation_bytes, dtype=float)
    inp = np.asarray(p.input_bytes, dtype=float)
    bb = np.asarray(p.boundary_bytes, dtype=float)
    kinds, budget = moments(p, s), float(p.budget[s])
    bytes_in = pulp.lpSum(st(x, s) * bb[x] for x in range(1, L)) if s > 0 else 0
    bytes_out = pulp.lpSum(st(x, s + 1) * bb[x] for x in range(1, L)) if s < S - 1 else 0
    if np.isfinite(budget):
        trans = _var(prob, f"T_{s}", 0) if cand or p.workspace_bytes is not None else 0
        work = np.zeros(L) if p.workspace_bytes is None else np.asarray(p.workspace_bytes, dtype=float)
        recomputed, back = set(cand), np.asarray(rematerialized(p), dtype=float)  # what a recompute brings back
        for l in range(L):  # the transient: each layer's backward holds its workspace and, recomputed, its activations
            if l in recomputed or work[l] > 0:
                prob += trans >= float(work[l]) * y(l, s) + (back[l] * z[l, s] if l in recomputed else 0)
        kept = (pulp.lpSum(y(l, s) * a[l] for l in range(L))
                - pulp.lpSum(z[l, s] * (a[l] - inp[l]) for l in cand))
        held_out = 0  # the stage's held output (part of kept)
        if p.held_output_bytes is not None:  # the stage's output: its last layer is x - 1 where stage s+1 starts at x
            held = np.asarray(p.held_output_bytes, dtype=float)
            held_out = pulp.lpSum(st(x, s + 1) * held[x - 1] for x in range(1, L)) if s < S - 1 else float(held[L - 1])
            kept = kept + held_out
        if p.entry_bytes is not None:  # the stage's first layer x: its input is the receive buffer
            entry = np.asarray(p.entry_bytes, dtype=float)
            kept = kept + (pulp.lpSum(st(x, s) * entry[x] for x in range(1, L)) if s > 0 else float(entry[0]))
        for n, e in enumerate(p.passthrough_edges):
            hold = _var(prob, f"h_{n}_{s}", 0)
            outside = [l for l in range(L) if l <= e.src or l >= e.dst or l in e.also_to]
            prob += hold >= 1 - pulp.lpSum(y(l, s) for l in outside)
            kept = kept + float(e.bytes_per_sample) * hold
        static = pulp.lpSum(y(l, s) * float(p.static_bytes[l]) for l in range(L))
        buf = (p.recv_microbatches, stage_batch_bytes(p.batch_input_bytes, p.batch_target_bytes, s == 0, s == S - 1))  # torch's receive buffers
        fixed = fixed_bytes(static, bytes_in, bytes_out, *buf)
        grads = (pulp.lpSum(y(l, s) * float(p.gradient_bytes[l]) for l in range(L)) if p.gradient_bytes is not None else 0)
        # held between a micro-batch's I and W; position 0 starts at layer 0, whose stage holds none (stage_wgrad)
        wgrad = (pulp.lpSum(y(l, s) * float(p.wgrad_bytes[l]) for l in range(L)) if p.wgrad_bytes is not None and s > 0 else 0)
        sent = sent_bytes(bytes_in, bytes_out, held_out, p.wgrad_bytes is not None, s == S - 1, p.loss_saved_bytes)  # sends, pending W
        running = _running_i(prob, p, y, s) if p.wgrad_bytes is not None and s > 0 and any(m.running_i for m in kinds) else 0
        w_work = _w_workspace(prob, p, y, s) if p.w_workspace_bytes is not None and s > 0 and any(m.running_w for m in kinds) else 0
        for moment in kinds:  # one row per moment at which the stage's memory can peak
            prob += (1.0 / budget) * (fixed + moment_bytes(moment, kept, trans, grads, wgrad, sent, held_out, running, w_work,
                                                           bytes_out)) <= 1.0 - _TIGHTEN
        prob += (1.0 / budget) * fixed <= 1.0 - _TIGHTEN
        if p.optimizer_workspace_bytes is not None:  # OW[s] >= ow_l y[l,s]: the optimizer step fits too
            step = _var(prob, f"OW_{s}", 0)
            for l in range(L):
                prob += step >= float(p.optimizer_workspace_bytes[l]) * y(l, s)
            prob += (1.0 / budget) * stage_bytes(static, bytes_in, bytes_out, 1.0, step, 0.0, 0.0, *buf) <= 1.0 - _TIGHTEN
    return stage_time_ms(
        pulp.lpSum(y(l, s) * float(p.compute_ms[l]) for l in range(L)),
        pulp.lpSum(z[l, s] * float(p.recompute_ms[l]) for l in cand),
        float(p.speed[s]), float(p.overhead_ms[s]),
        pulp.lpSum(st(x, s) * _send(p, s - 1, bb[x]) for x in range(1, L)) if s > 0 else 0.0,
        pulp.lpSum(st(x, s + 1) * _send(p, s, bb[x]) for x in range(1, L)) if s < S - 1 else 0.0,
    )


def _running_i(prob, p: PartitionProblem, y, s: int):
    """A variable E >= planner.cost.held.running_i_extra of stage s: for each layer l of the stage,
    E >= max(ws_l, w_l) + sum over the stage's later layers k of w_k - T0 (relaxed by the stage's
    whole wgrad off the stage), where T0 is the workspace of one layer of the stage picked by
    binaries: never above the stage's largest, and the solver may pick that one, so E's least
    value is running_i_extra's."""
    import pulp

    L = p.n_layers
    w = np.asarray(p.wgrad_bytes, dtype=float)
    ws = np.zeros(L) if p.workspace_bytes is None else np.asarray(p.workspace_bytes, dtype=float)
    extra = _var(prob, f"RI_{s}", 0)
    largest = 0
    if np.any(ws > 0):
        pick = [_var(prob, f"RIws_{l}_{s}", 0, 1, cat="Binary") for l in range(L)]
        for l in range(L):
            prob += pick[l] <= y(l, s)
        prob += pulp.lpSum(pick) == 1
        largest = pulp.lpSum(pick[l] * float(ws[l]) for l in range(L))
    big = float(np.sum(w))
    for l in range(L):
        later = pulp.lpSum(y(k, s) * float(w[k]) for k in range(l + 1, L))
        prob += extra >= float(max(ws[l], w[l])) * y(l, s) + later - largest - big * (1 - y(l, s))
    return extra


def _w_workspace(prob, p: PartitionProblem, y, s: int):
    """A variable V >= planner.cost.w_workspace.stage_w_workspace of stage s: V >= ww_l for each layer
    l of the stage, and V >= ww_l + c_k where the nearest earlier layer k with a carry is in the stage too
    (stages are contiguous: then every layer between is, and none of them has a carry)."""
    ww = np.asarray(p.w_workspace_bytes, dtype=float)
    carry = np.zeros(len(ww)) if p.w_carry_bytes is None else np.asarray(p.w_carry_bytes, dtype=float)
    extra = _var(prob, f"WW_{s}", 0)
    k = -1  # the nearest earlier layer with a carry
    for l in range(p.n_layers):
        if ww[l] > 0:
            prob += extra >= float(ww[l]) * y(l, s)
        if k >= 0:
            both = float(ww[l] + carry[k])
            prob += extra >= both * y(l, s) + both * y(k, s) - both
        if carry[l] > 0:
            k = l
    return extra


def solve_ilp(p: PartitionProblem, time_limit: float = 60.0) -> Solution | None:
    """Solve `p` with an ILP; None when infeasible. Solution.optimal is False on a time-out.

    Two passes: minimize the bottleneck stage time, then the total within _PASS2_TOL of it."""
    import pulp

    L, S = p.n_layers, p.n_stages
    if S < 1 or S > L:
        return None
    prob = pulp.LpProblem("pplan_partition", pulp.LpMinimize)
    cuts = _cut_variables(prob, L, S)
    cand, r, z = _recompute_variables(prob, p, cuts)
    zvar = _var(prob, "Z", 0)
    times = []
    for s in range(S):
        t = _stage_time(prob, p, cuts, s, cand, z)
        times.append(t)
        prob += zvar >= t

    prob.setObjective(zvar)
    if not _run(prob, time_limit):
        return None
    first = _extract(p, cuts.w, r, cand)
    optimal = prob.sol_status == pulp.LpSolutionOptimal
    limit = first.bottleneck_ms * (1 + _PASS2_TOL) + 1e-12
    for s in range(S):
        prob += times[s] <= limit
    prob.setObjective(pulp.lpSum(times))
    if not _run(prob, time_limit):
        return first
    second = _extract(p, cuts.w, r, cand)
    optimal = optimal and prob.sol_status == pulp.LpSolutionOptimal
    best = second if second.total_ms <= first.total_ms and second.bottleneck_ms <= limit else first
    return Solution(**{**best.__dict__, "method": "ilp", "optimal": optimal})


def _run(prob, time_limit: float) -> bool:
    import pulp

    solver = _solver(time_limit)
    # A command-line solver (CBC) exchanges the model (~1 MB .mps) and its solution through files
    # in solver.tmpDir, and deletes them only after a solve that returns: Ctrl-C or a solver error
    # left them in /tmp. Here they live in a folder of ours that is removed however the solve ends.
    with tempfile.TemporaryDirectory(prefix="pplan-ilp-") as scratch:
        if hasattr(solver, "tmpDir"):  # HiGHS through highspy exchanges no files
            solver.tmpDir = scratch
        try:
            prob.solve(solver)
        except pulp.PulpSolverError as e:
            raise PplanError(f"ILP solver failed: {e}", "use --method dp") from None
        except BaseException:
            _stop_solver(scratch)
            raise
    return prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)


def _stop_solver(scratch: str) -> None:
    """Stop a solver process still working on the files in `scratch` (a Ctrl-C or SIGTERM arrived
    while the solve waited for it): left alone, CBC ran on to its time limit after pplan had
    exited. Found among this process's children by its command line, which names those files
    (Linux's /proc; elsewhere nothing). A child in the middle of its exec shows an empty command
    line for a moment (measured under load: 11 solves in 40 missed it), so that is waited out."""
    import signal
    import time

    ours = str(os.getpid())
    for _ in range(100):  # at most about a second
        starting = False
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                state, ppid = stat.read_text().rpartition(")")[2].split()[:2]
                if ppid != ours or state == "Z":  # another's, or ended (its command line stays empty)
                    continue
                cmdline = (stat.parent / "cmdline").read_bytes()
                if scratch.encode() in cmdline:
                    os.kill(int(stat.parent.name), signal.SIGKILL)
                starting = starting or not cmdline
            except (OSError, ValueError, IndexError):  # gone meanwhile, or not ours to stop
                continue
        if not starting:
            return
        time.sleep(0.01)


def _extract(p: PartitionProblem, w: dict, r: dict, cand: list[int]) -> Solution:
    L, S = p.n_layers, p.n_stages
    stage_of = [sum(int(round(w[l, s].value() or 0)) for s in range(1, S)) for l in range(L)]
    cuts = [0] + [next(l for l in range(L) if stage_of[l] >= s) for s in range(1, S)] + [L]
    rec = []
    for s in range(S):
        chosen = []
        for l in cand:
            if cuts[s] <= l < cuts[s + 1]:
                val = r[l] if isinstance(r[l], int) else int(round(r[l].value() or 0))
                if val:
                    chosen.append(l)
        rec.append(tuple(chosen))
    return evaluate(p, tuple(cuts), tuple(rec), "ilp")
