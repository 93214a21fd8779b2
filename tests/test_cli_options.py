"""cli/options.py: the parameters several commands share read the same in each of them."""

from __future__ import annotations

from typing import Any, get_args

import pytest

# shared declaration -> the (command, Python parameter name) pairs that take it: each must show the
# declared help and parse the same way
SHARED = {
    "PlanArgument": (("simulate", "plan_path"), ("run", "plan")),
    "CalibrationOption": (("simulate", "calibration"), ("partition", "calibration")),
}


def _declared(name: str) -> Any:
    import cli.options

    return get_args(getattr(cli.options, name))[1]  # Annotated[type, typer info] -> the typer info


def _param(command: str, param: str) -> Any:
    from typer.main import get_command

    from cli.app import app

    by_name = {p.name: p for p in get_command(app).commands[command].params}  # type: ignore[attr-defined]
    return by_name[param]


def _parsing(param: Any) -> tuple:
    """What decides how a command line is read: kind, flags (options), required, default, metavar."""
    flags = tuple(param.opts) if param.param_type_name == "option" else ()
    return param.param_type_name, flags, param.required, param.default, param.metavar


@pytest.mark.parametrize("shared", sorted(SHARED))
def test_every_command_taking_a_shared_parameter_reads_it_alike_with_the_declared_help(shared: str) -> None:
    built = [_param(command, param) for command, param in SHARED[shared]]
    assert [p.help for p in built] == [_declared(shared).help] * len(built)
    assert len({_parsing(p) for p in built}) == 1, [_parsing(p) for p in built]


def test_plan_argument_is_required_and_calibration_is_optional() -> None:
    plan, calibration = _param("simulate", "plan_path"), _param("simulate", "calibration")
    assert plan.required and plan.metavar == "PLAN.json"
    assert not calibration.required and calibration.default is None and calibration.opts == ["--calibration"]
