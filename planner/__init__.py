"""pplan: plan, simulate and run pipeline-parallel training of PyTorch models.

The library never imports typer, and imports torch or matplotlib only in the modules that
measure, execute or draw, so planning and simulation start fast.

For your own training loop (docs/executor.md, "Your own training loop"):

    from planner import load_plan, build_pipeline

Both are loaded on first use (module `__getattr__`): `import planner` imports no torch.
"""

from typing import Any

__version__ = "0.1.0"

__all__ = ["load_plan", "build_plan_model", "build_pipeline", "Pipeline", "__version__"]

_LAZY = {
    "load_plan": ("planner.plan", "load_plan"),
    "build_plan_model": ("planner.execute.plan_model", "build_plan_model"),
    "build_pipeline": ("planner.execute.pipeline", "build_pipeline"),
    "Pipeline": ("planner.execute.pipeline", "Pipeline"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'planner' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
