"""The time left that `pplan profile` reports, weighted by each step's cost (planner.profiling.progress).

No real timing: durations are given, and the progress reporter runs on a fake clock.
"""

from __future__ import annotations

import pytest

from planner.profiling.progress import (CO_RUN, LAYER, OPTIMIZER, UNITS, EtaModel, ProfileProgress, Step,
                                        profile_progress, profile_steps)

SIZES = (1, 2, 4, 8, 16)


def _model(n_layers: int = 2, *, params: list[int] | None = None, co_run: bool = False, runs: int = 4,
           prior: float = 0.0) -> EtaModel:
    steps = profile_steps(SIZES, n_layers, co_run=co_run)
    return EtaModel(steps, params if params is not None else [0] * n_layers, runs_per_step=runs, optimizer_steps=1,
                    prior_s_per_param_step=prior)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_steps_follow_the_profilers_order() -> None:
    steps = profile_steps((1, 2), 2, co_run=True)
    assert steps == [Step(CO_RUN, 1, -1), Step(LAYER, 1, 0), Step(LAYER, 1, 1), Step(CO_RUN, 2, -1),
                     Step(LAYER, 2, 0), Step(LAYER, 2, 1), Step(OPTIMIZER, 0, 0), Step(OPTIMIZER, 0, 1)]


def test_nothing_is_estimated_before_a_layer_is_measured() -> None:
    assert _model().remaining_s() is None


def test_remaining_layers_cost_their_time_per_sample_times_the_size() -> None:
    m = _model()
    m.record(Step(LAYER, 1, 0), 0.5)  # layer 0: 0.5 s per sample
    m.record(Step(LAYER, 1, 1), 1.5)  # layer 1: 1.5 s per sample
    # sizes 2+4+8+16 = 30 samples per layer left: 30 * (0.5 + 1.5)
    assert m.remaining_s() == pytest.approx(60.0)


def test_counting_steps_would_say_far_less() -> None:
    """The bug: after 2 of 10 layer steps, extrapolating the count says 4 x what they took."""
    m = _model()
    m.record(Step(LAYER, 1, 0), 1.0)
    m.record(Step(LAYER, 1, 1), 1.0)
    naive = 2.0 * 8 / 2
    assert m.remaining_s() == pytest.approx(60.0) and m.remaining_s() > 7 * naive


def test_a_layer_not_measured_yet_costs_the_mean_of_those_that_are() -> None:
    m = _model(3)
    m.record(Step(LAYER, 1, 0), 1.0)
    m.record(Step(LAYER, 1, 1), 3.0)  # mean 2 s per sample
    assert m.remaining_s() == pytest.approx(2.0 * 1 + 30 * (1.0 + 3.0 + 2.0))  # layer 2 at 1, all at 2..16


def test_the_largest_size_measured_so_far_sets_the_rate() -> None:
    """A fixed cost per step weighs most at size 1: the rate is refined as larger sizes are measured."""
    m = _model(1)
    m.record(Step(LAYER, 1, 0), 3.0)  # 3 s per sample at size 1
    assert m.remaining_s() == pytest.approx(3.0 * 30)
    m.record(Step(LAYER, 2, 0), 2.0)  # 1 s per sample at size 2
    assert m.remaining_s() == pytest.approx(1.0 * 28)
    assert m.basis() == 2


def test_optimizer_steps_use_a_prior_per_parameter_then_the_measured_rate() -> None:
    m = _model(2, params=[1000, 3000], prior=1e-3)
    for size in SIZES:
        for layer in (0, 1):
            m.record(Step(LAYER, size, layer), 0.0)
    assert m.remaining_s() == pytest.approx(1e-3 * 4000)
    m.record(Step(OPTIMIZER, 0, 0), 10.0)  # 10 ms per parameter measured
    assert m.remaining_s() == pytest.approx(0.01 * 3000)


def test_a_layer_without_parameters_has_a_free_optimizer_step() -> None:
    m = _model(2, params=[0, 100], prior=1.0)
    for size in SIZES:
        for layer in (0, 1):
            m.record(Step(LAYER, size, layer), 1.0)
    assert m.remaining_s() == pytest.approx(100.0)


def test_the_first_co_run_switch_includes_the_workers_start_and_prices_nothing() -> None:
    m = _model(1, co_run=True, runs=4)
    m.record(Step(CO_RUN, 1, -1), 50.0)  # the workers' start: not a cost per sample
    m.record(Step(LAYER, 1, 0), 4.0)
    # switches to 2, 4, 8, 16: one iteration each, a quarter of a layer step (4 runs per step)
    assert m.remaining_s() == pytest.approx(4.0 * 30 + 1.0 * 30)
    m.record(Step(CO_RUN, 2, -1), 1.0)  # 0.5 s per sample
    assert m.remaining_s() == pytest.approx(4.0 * 30 + 0.5 * 28)


def test_a_step_recorded_twice_or_unknown_changes_nothing() -> None:
    m = _model(1)
    m.record(Step(LAYER, 1, 0), 1.0)
    before = m.remaining_s()
    m.record(Step(LAYER, 1, 0), 99.0)
    m.record(Step(LAYER, 3, 0), 99.0)
    assert m.remaining_s() == before


def _progress(clock: FakeClock, calls: list[tuple[int, int, str]], n_layers: int = 1) -> ProfileProgress:
    return profile_progress(SIZES, [0] * n_layers, co_run=False, device="cpu", warmup=1, repeats=3,
                            on_step=lambda done, total, note: calls.append((done, total, note)), clock=clock)


def _cli_eta(elapsed: float, done: int, total: int) -> float:
    """What `pplan profile`'s bar extrapolates from (done, total) (cli.common.eta_text)."""
    return elapsed * (total - done) / done


def test_a_step_count_extrapolation_of_the_reported_units_gives_the_weighted_estimate() -> None:
    clock, calls = FakeClock(), []
    p = _progress(clock, calls)
    p.start()
    assert calls == [(0, UNITS, "")]
    clock.now += 5.0  # building and warming up: no step's cost
    p.measuring()
    clock.now += 2.0
    p.done(Step(LAYER, 1, 0), "micro-batch 1 l0")  # 2 s per sample: 60 s left for sizes 2..16
    done, total, note = calls[-1]
    shown = [c[0] for c in calls]
    assert total == UNITS and shown == sorted(set(shown)) and len(calls) <= 3  # once per step, never back
    assert _cli_eta(7.0, done, total) == pytest.approx(60.0, rel=0.01)
    assert "1/6 steps" in note and "estimated from micro-batch 1" in note


def test_units_reach_the_total_only_with_the_last_step_and_never_go_back() -> None:
    clock, calls = FakeClock(), []
    p = _progress(clock, calls)
    p.start()
    p.measuring()
    for size, seconds in zip(SIZES, (1.0, 2.0, 40.0, 8.0, 16.0)):  # size 4 far slower than its share
        clock.now += seconds
        p.done(Step(LAYER, size, 0), f"micro-batch {size}")
        assert max(c[0] for c in calls) < UNITS
    clock.now += 0.1
    p.done(Step(OPTIMIZER, 0, 0), "optimizer step l0")
    shown = [c[0] for c in calls]
    assert shown[-1] == UNITS and shown == sorted(shown) and len(set(shown)) == len(shown)


def test_without_a_callback_nothing_is_reported_but_the_model_still_learns() -> None:
    clock = FakeClock()
    p = profile_progress(SIZES, [0], co_run=False, device="cuda:1", warmup=0, repeats=1, on_step=None, clock=clock)
    p.start()
    p.measuring()
    clock.now += 1.0
    p.done(Step(LAYER, 1, 0), "x")
    assert p.model.remaining_s() == pytest.approx(30.0)


def test_the_profiler_reports_thousandths_of_the_work_up_to_the_optimizer_steps() -> None:
    """Before: on_step counted layer steps (done/total = steps), and stopped before the optimizer steps."""
    from planner.profiling.profiler import profile_model

    calls: list[tuple[int, int, str]] = []
    profile_model("mlp:layers=2,hidden=16,input=8,classes=4", [1, 2], warmup=0, repeats=1,
                  on_step=lambda done, total, note: calls.append((done, total, note)))
    assert calls[0] == (0, UNITS, "") and {total for _, total, _ in calls} == {UNITS}
    shown = [done for done, _, _ in calls]
    assert shown == sorted(set(shown)) and shown[-1] == UNITS and all(d < UNITS for d in shown[:-1])  # rising, to the end
    assert calls[-1][2].startswith("optimizer step")


def _brute_force(steps: list[Step], done: dict[Step, float], params: list[int], runs: int, prior: float) -> float | None:
    """The rule of planner.profiling.progress, step by step, without running sums."""
    rate: dict[int, tuple[int, float]] = {}
    switches = [(st, t) for st, t in done.items() if st.kind == CO_RUN][1:]
    for st, t in done.items():
        if st.kind == LAYER and (st.layer not in rate or st.size >= rate[st.layer][0]):
            rate[st.layer] = (st.size, t / st.size)
    if not rate:
        return None
    mean = sum(r for _, r in rate.values()) / len(rate)
    per_sample = [rate.get(i, (0, mean))[1] for i in range(len(params))]
    opt = [(t, params[st.layer]) for st, t in done.items() if st.kind == OPTIMIZER and params[st.layer]]
    opt_rate = sum(t for t, _ in opt) / sum(p for _, p in opt) if opt else prior
    total = 0.0
    for st in (st for st in steps if st not in done):
        if st.kind == LAYER:
            total += per_sample[st.layer] * st.size
        elif st.kind == CO_RUN:
            total += (switches[-1][1] / switches[-1][0].size if switches else sum(per_sample) / runs) * st.size
        else:
            total += opt_rate * params[st.layer]
    return total


def test_the_running_sums_match_the_rule_step_by_step() -> None:
    import random

    rng = random.Random(7)
    params = [0, 50, 2000, 7]
    steps = profile_steps(SIZES, len(params), co_run=True)
    for trial in range(20):
        order = steps[:]
        if trial % 2:
            rng.shuffle(order)  # the model does not depend on the order the steps come in
        m = EtaModel(steps, params, runs_per_step=3, optimizer_steps=1, prior_s_per_param_step=1e-4)
        done: dict[Step, float] = {}
        for step in order:
            seconds = rng.uniform(0.0, 5.0)
            m.record(step, seconds)
            done[step] = seconds
            expected = _brute_force(steps, done, params, 3, 1e-4)
            assert (m.remaining_s() is None) == (expected is None)
            if expected is not None:
                assert m.remaining_s() == pytest.approx(expected, rel=1e-9, abs=1e-9)
