"""Each list or constant that several modules use has one home; these tests hold every former copy
to it, so a copy written again (and later drifting) fails here.

The homes: planner.limits.OPTIMIZERS (optimizer names), MAX_LAYER_MS / MAX_LAYER_BYTES (a profile
row's bounds), DEFAULT_BANDWIDTH / DEFAULT_LATENCY_MS (the default link), and
planner.cost.comm.ms_per_byte (bandwidth to ms per byte).
"""

from __future__ import annotations

import inspect
import math
import typing
from dataclasses import replace

import numpy as np
import pytest

import planner.execute.calibrate as calibrate
import planner.machine
import planner.plan
import planner.plan.checks
from cli.cmd_partition import partition_cmd
from planner.cost.comm import Link, link_terms, ms_per_byte
from planner.cost.memory import OPTIMIZER_STATE_FACTOR, optimizer_factor
from planner.errors import PlanError, PplanError, ProfileError
from planner.execute.machinebench import optimizer_ms_per_mib
from planner.limits import (
    DEFAULT_BANDWIDTH, DEFAULT_LATENCY_MS, MAX_LAYER_BYTES, MAX_LAYER_MS, OPTIMIZER_MEANINGS, OPTIMIZERS,
)
from planner.partition.api import validate_settings
from planner.partition.options import settings_from_options
from planner.partition.search import PartitionSettings
from planner.plan import Links
from planner.profiling.csvio import parse_profile_csv
from planner.units import parse_link_bandwidth, parse_ms
from helpers.profiles import profile_csv, random_profile


def _help(option: str) -> str:
    """The help text `pplan partition` shows for the parameter named `option`."""
    hints = typing.get_type_hints(partition_cmd, include_extras=True)
    return hints[option].__metadata__[0].help


def _just_above(bound: float) -> float:
    return math.nextafter(bound, math.inf)


# --- optimizer names -------------------------------------------------------------------------

def test_the_optimizer_names_are_the_meanings_keys() -> None:
    assert OPTIMIZERS == tuple(OPTIMIZER_MEANINGS) == ("adam", "adamw", "sgd", "sgd-plain")


def test_every_reader_of_optimizer_names_uses_the_one_tuple() -> None:
    assert planner.plan.OPTIMIZERS is OPTIMIZERS
    assert planner.plan.checks.OPTIMIZERS is OPTIMIZERS
    assert planner.machine.OPTIMIZERS is OPTIMIZERS
    assert inspect.signature(optimizer_ms_per_mib).parameters["names"].default is OPTIMIZERS


def test_the_memory_model_prices_exactly_the_named_optimizers() -> None:
    assert tuple(OPTIMIZER_STATE_FACTOR) == OPTIMIZERS
    with pytest.raises(PplanError) as e:
        optimizer_factor("lion")
    assert e.value.hint == f"choose one of {', '.join(OPTIMIZERS)}"


def test_a_plan_refuses_a_name_outside_the_tuple_and_lists_the_tuple() -> None:
    plan = planner.plan.Plan(schedule="gpipe", micro_batch_size=1, n_microbatches=1,
                             stages=(planner.plan.StagePlan(device=0, layers=(0, 1)),),
                             devices=(planner.plan.Device(name="dev0"),))
    for name in OPTIMIZERS:
        replace(plan, optimizer=name)
    with pytest.raises(PlanError) as e:
        replace(plan, optimizer="lion")
    assert e.value.hint == f"use one of {', '.join(OPTIMIZERS)}"


def test_the_cli_help_lists_exactly_the_optimizer_names() -> None:
    text = _help("optimizer")
    listed = text.split(": ", 1)[1].split("; ")[0].split(", ")
    assert [item.split(" (")[0] for item in listed] == list(OPTIMIZERS)
    assert [item.split(" (", 1)[1].rstrip(")") for item in listed] == list(OPTIMIZER_MEANINGS.values())


def test_the_executor_builds_every_named_optimizer() -> None:
    torch = pytest.importorskip("torch")
    from planner.execute.stages import make_optimizer

    for name in OPTIMIZERS:
        assert make_optimizer(name, [torch.nn.Parameter(torch.zeros(2))], lr=0.1) is not None
    with pytest.raises(PplanError):
        make_optimizer("lion", [torch.nn.Parameter(torch.zeros(2))], lr=0.1)


# --- a profile row's bounds ------------------------------------------------------------------

def _one_layer_csv(fwd_ms: float, param_bytes: float) -> str:
    return profile_csv({}, [(0, "l0", 1, repr(fwd_ms), 1, repr(param_bytes), 1, 1)])


@pytest.mark.parametrize(("fwd_ms", "param_bytes", "column"), [
    (_just_above(MAX_LAYER_MS), 1.0, "fwd_ms"), (1.0, _just_above(MAX_LAYER_BYTES), "param_bytes"),
])
def test_the_profile_reader_refuses_just_above_the_shared_bounds(fwd_ms: float, param_bytes: float, column: str) -> None:
    with pytest.raises(ProfileError, match=f"column '{column}'.*too large for any real device"):
        parse_profile_csv(_one_layer_csv(fwd_ms, param_bytes), "p.csv")


def test_the_profile_reader_takes_the_shared_bounds_themselves() -> None:
    table = parse_profile_csv(_one_layer_csv(MAX_LAYER_MS, MAX_LAYER_BYTES), "p.csv")
    assert table.columns["fwd_ms"][0, 0] == MAX_LAYER_MS
    assert table.columns["param_bytes"][0, 0] == MAX_LAYER_BYTES


@pytest.mark.parametrize(("column", "bound"), [("fwd_ms", MAX_LAYER_MS), ("optimizer_ms", MAX_LAYER_MS),
                                               ("param_bytes", MAX_LAYER_BYTES), ("output_bytes", MAX_LAYER_BYTES)])
def test_the_partition_api_holds_a_profile_built_in_code_to_the_same_bounds(column: str, bound: float) -> None:
    profile = random_profile(np.random.default_rng(0), 4)
    settings = PartitionSettings(n_devices=2, memory_bytes=None, global_batch=4)

    def with_value(value: float):
        data = np.array(profile.columns[column])
        data[1, 0] = value
        return replace(profile, columns={**profile.columns, column: data})

    validate_settings(with_value(bound), settings)
    with pytest.raises(ProfileError, match=f"{column}=.*too large for any device"):
        validate_settings(with_value(_just_above(bound)), settings)


# --- the default link ------------------------------------------------------------------------

def test_every_default_link_is_the_shared_one() -> None:
    assert planner.plan.DEFAULT_BANDWIDTH is DEFAULT_BANDWIDTH and planner.plan.DEFAULT_LATENCY_MS is DEFAULT_LATENCY_MS
    assert (Links().bandwidth_bytes_per_s, Links().latency_ms) == (DEFAULT_BANDWIDTH, DEFAULT_LATENCY_MS)
    default = PartitionSettings(n_devices=2, memory_bytes=None, global_batch=4)
    assert (default.bandwidth, default.latency_ms) == (DEFAULT_BANDWIDTH, DEFAULT_LATENCY_MS)
    parsed = settings_from_options(devices=2, memory=None, global_batch=4)
    assert (parsed.bandwidth, parsed.latency_ms) == (DEFAULT_BANDWIDTH, DEFAULT_LATENCY_MS)


def test_the_cli_help_names_the_shared_default_link() -> None:
    bandwidth = _help("bandwidth").split("(default ", 1)[1].split(";")[0]
    latency = _help("latency").split("(default ", 1)[1].split(";")[0]
    assert parse_link_bandwidth(bandwidth) == DEFAULT_BANDWIDTH
    assert parse_ms(latency) == DEFAULT_LATENCY_MS


# --- ms per byte -----------------------------------------------------------------------------

def test_the_cost_model_and_the_calibration_convert_bandwidth_alike() -> None:
    assert calibrate.ms_per_byte is ms_per_byte
    assert ms_per_byte(2e9) == 5e-7
    assert link_terms(Link(bandwidth_bytes_per_s=2e9, latency_ms=0.5)) == (0.5, ms_per_byte(2e9))
