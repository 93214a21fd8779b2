"""Whose code runs: a `module:factory` model named only inside a file is not imported.

A plan (or the profile it came from) may come from someone else. Its `model` field is
rebuilt by `pplan run` and `pplan calibrate` in every rank, and a `package.module:factory`
spec imports that module and calls that function: `"model": "os:system:command=rm -rf ~"`
would run a shell command. Built-in specs (gpt, mlp, resnet, synthetic) run only pplan's own
code and stay allowed. A factory spec is allowed only when the person at the keyboard says
so: `--model SPEC` on the command line, equal to the file's spec, or `--trust-model`.

This is checked by the library entry that runs a plan, planner.execute.run.run_plan (its
`model` and `trust_model` are what `pplan run` and `pplan calibrate` pass for --model and
--trust-model), before anything is imported or any process starts: every caller of
`run_plan(load_plan(path), ...)` is protected, not only the CLI. `build_model` takes a spec its
caller wrote, not one read from a file, and is not second-guessed.
"""

from __future__ import annotations

from planner.errors import ModelSpecError
from planner.models.spec import parse_spec

__all__ = ["check_model_trusted", "is_builtin"]


def is_builtin(spec: str) -> bool:
    """True when `spec` names a built-in model (parsed without importing anything).

    Raises ModelSpecError for a spec that is neither a built-in nor a `module:factory`.
    """
    kind, _ = parse_spec(spec)
    return kind != "factory"


def check_model_trusted(spec: str | None, cli_model: str | None, trust: bool, *, source: str = "the plan") -> None:
    """Refuse, before any import, to build `spec` (read from `source`) unless it is safe or vouched for.

    - `cli_model` (the command line's --model), when given, must equal `spec`: it names the
      model the user means to run, and running another one would be a surprise either way;
    - a built-in `spec` is allowed;
    - a `module:factory` spec is allowed only with `trust` (--trust-model) or a matching
      `cli_model`.
    A missing `spec` passes (the caller reports it). Raises ModelSpecError with one line.
    """
    if not spec:
        return
    text = spec.strip()
    if cli_model is not None:
        wanted = cli_model.strip()
        parse_spec(wanted)  # a malformed --model is reported as such
        if wanted != text:
            raise ModelSpecError(f"--model {wanted!r} does not match the model {text!r} in {source}",
                                 "pass the file's model string exactly, or leave --model out")
        return
    if is_builtin(text) or trust:
        return
    raise ModelSpecError(
        f"{source} names the model {text!r}, which is Python code (module:factory) that pplan would import and run; "
        "refused because only the file names it",
        f"if you trust it, pass --model {_quote(text)} (the same string) or --trust-model",
    )


def _quote(text: str) -> str:
    """`text` as one shell word (single quotes when it needs any)."""
    import shlex

    return shlex.quote(text)
