"""`pplan profile`: measure every layer of a model at several micro-batch sizes -> profile CSV."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.common import echo_json, err, given_params, parse_int_list, parse_shape, step_progress
from planner.errors import PplanError
from planner.units import format_bytes, format_ms

if TYPE_CHECKING:  # the command imports it when it runs: `pplan --help` stays light
    from planner.profiling.options import ProfileOptions

__all__ = ["register"]


def _check_out(out: Path) -> None:
    if out.is_dir():
        raise PplanError(f"--out {str(out)!r} is a directory", "give a file name such as profiles/gpt.csv")
    if out.suffix.lower() != ".csv":
        raise PplanError(f"--out {str(out)!r} should end in .csv", "profiles are CSV files, e.g. profiles/gpt.csv")
    from planner.atomic import ensure_writable_file

    ensure_writable_file(out, "--out")  # before minutes of measuring


def _summary(profile: Any, path: Path, sha: str) -> dict[str, Any]:
    k = len(profile.micro_batch_sizes) - 1
    c = profile.columns
    size = profile.micro_batch_sizes[k]
    skip = [0] * profile.n_layers  # bytes each layer sends past the next layer (a skip tensor), at `size`
    for edge in profile.skip_edges:
        skip[edge.src] += edge.bytes_per_sample * size
    return {
        "path": str(path),
        "sha256": sha,
        "model": profile.meta.get("model"),
        "device": profile.meta.get("device"),
        "dtype": profile.meta.get("dtype"),
        "micro_batch_sizes": list(profile.micro_batch_sizes),
        "elapsed_s": float(profile.meta.get("elapsed_s", 0)),
        "co_run": int(profile.meta.get("co_run") or 0),
        "summary_micro_batch_size": profile.micro_batch_sizes[k],
        "layers": [
            {
                "layer": i, "name": name,
                "fwd_ms": round(float(c["fwd_ms"][i, k]), 6), "bwd_ms": round(float(c["bwd_ms"][i, k]), 6),
                "param_bytes": int(c["param_bytes"][i, k]), "activation_bytes": int(c["activation_bytes"][i, k]),
                "output_bytes": int(c["output_bytes"][i, k]), "skip_bytes": skip[i],
            }
            for i, name in enumerate(profile.names)
        ],
    }


def _print_table(s: dict[str, Any]) -> None:
    beside = f", beside {s['co_run']} co-running process(es)" if s.get("co_run") else ""
    typer.echo(f"{s['model']} on {s['device']} ({s['dtype']}), micro-batch sizes {','.join(map(str, s['micro_batch_sizes']))}{beside}: {s['elapsed_s']:.1f} s")
    typer.echo(f"per layer at micro-batch size {s['summary_micro_batch_size']}:")
    width = max(4, *(len(row["name"]) for row in s["layers"]))
    # output: bytes sent to the next layer; a layer whose tensor is read further on also shows "+ N skip"
    typer.echo(f"{'layer':>5}  {'name':<{width}}  {'fwd':>10}  {'bwd':>10}  {'params':>10}  {'activations':>11}  {'output':>10}")
    totals = {"fwd_ms": 0.0, "bwd_ms": 0.0, "param_bytes": 0, "activation_bytes": 0}
    for row in s["layers"]:
        for key in totals:
            totals[key] += row[key]
        typer.echo(
            f"{row['layer']:>5}  {row['name']:<{width}}  {format_ms(row['fwd_ms']):>10}  {format_ms(row['bwd_ms']):>10}  "
            f"{format_bytes(row['param_bytes']):>10}  {format_bytes(row['activation_bytes']):>11}  {format_bytes(row['output_bytes']):>10}"
            + (f" + {format_bytes(row['skip_bytes'])} skip" if row.get("skip_bytes") else "")
        )
    typer.echo(
        f"{'':>5}  {'total':<{width}}  {format_ms(totals['fwd_ms']):>10}  {format_ms(totals['bwd_ms']):>10}  "
        f"{format_bytes(totals['param_bytes']):>10}  {format_bytes(totals['activation_bytes']):>11}"
    )
    typer.echo(f"wrote {s['path']}")


def register(app: typer.Typer) -> None:
    app.command("profile")(profile)


_MODEL_HELP = ("A built-in gpt|resnet|mlp|synthetic[:key=value,...]; a Hugging Face model built from its config, "
               "hf:MODEL_TYPE[:config_key=value,...] (e.g. hf:gpt2:n_layer=4; needs pip install -e '.[hf]'); or "
               "package.module:factory[:key=value,...] returning your nn.Module: an nn.Sequential or any module "
               "torch.fx can trace (docs/models.md).")


def profile(
    ctx: typer.Context,
    model: Annotated[str, typer.Option("--model", "-m", help=_MODEL_HELP)] = ...,
    micro_batch_sizes: Annotated[str, typer.Option("--micro-batch-sizes", "-b", help="Micro-batch sizes to measure, e.g. 1,2,4,8,16,32.")] = "1,2,4,8",
    device: Annotated[str, typer.Option("--device", help="cpu, cuda or cuda:N (one process measures on one device).")] = "cpu",
    dtype: Annotated[str, typer.Option("--dtype", help="float32, bfloat16 or float16 (parameters and float inputs).")] = "float32",
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed runs before measuring.")] = 3,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed runs; the median is recorded. At 15, two profiles of a small gpt here agreed within about 20% on layers of a millisecond or more (25% at worst); layers under 0.2 ms varied up to 84%.")] = 15,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the weights and the batch.")] = 0,
    timer: Annotated[str, typer.Option("--timer", help="sched: wall time minus time spent waiting for a CPU (steady on a busy machine); wall: plain wall time.")] = "sched",
    threads: Annotated[int, typer.Option("--threads", help="torch CPU threads while measuring: the number each pipeline stage will have (cores / stages). 1 gives the steadiest timings.")] = 1,
    co_run: Annotated[int, typer.Option(
        "--co-run", help="Measure while K other processes train the same model at the same size and --threads, "
        "as a CPU pipeline's other ranks do: give ranks - 1 when the ranks share one machine's memory bandwidth "
        "(memory-bound layers and the optimizer step ran 1.3-1.6x slower beside another rank). "
        "Needs (K + 1) x --threads cores; refused with --device cuda (each GPU has its own memory).")] = 0,
    out: Annotated[Path, typer.Option("--out", "-o", help="Profile CSV to write (atomically).")] = Path("profile.csv"),
    input_shape: Annotated[str | None, typer.Option("--input-shape", help="module:factory and hf: models: one sample's shape, e.g. 3,32,32 (an hf: language model: its sequence length, e.g. 64).")] = None,
    input_dtype: Annotated[str | None, typer.Option("--input-dtype", help="Factory models: float (the default) or long.")] = None,
    vocab: Annotated[int | None, typer.Option("--vocab", help="Factory models with --input-dtype long: token ids below this.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON summary instead of a table.")] = False,
    analytic: Annotated[bool, typer.Option("--analytic", help="Run nothing: compute the profile of a built-in gpt on --hardware from FLOPs and bytes (docs/hardware.md).")] = False,
    hardware: Annotated[str | None, typer.Option("--hardware", help="With --analytic: a preset (see `pplan hardware`) or a hardware JSON file.")] = None,
) -> None:
    """Measure forward/backward time and memory of every layer at each micro-batch size."""
    from planner.models import parse_spec
    from planner.models.spec import check_input_flags
    from planner.profiling.options import ProfileOptions

    parse_spec(model)  # a bad --model or setting fails here, before torch is imported (seconds on a small machine)
    opts = ProfileOptions(tuple(parse_int_list(micro_batch_sizes, "--micro-batch-sizes")), device=device, dtype=dtype,
                          warmup=warmup, repeats=repeats, seed=seed, threads=threads, timer=timer, co_run=co_run,
                          input_shape=parse_shape(input_shape), input_dtype=input_dtype or "float", vocab=vocab)
    # after the values' own checks; input_dtype as given (None: not given), since a built-in reads none of them
    check_input_flags(model, input_shape=opts.input_shape, input_dtype=input_dtype, vocab=opts.vocab)
    _check_out(out)
    _refuse_unused(ctx, analytic)
    if analytic:
        _analytic(model, list(opts.micro_batch_sizes), hardware, dtype, out, json_out, opts.seed)
        return
    _measured(model, opts, out, json_out)


def _measured(model: str, opts: ProfileOptions, out: Path, json_out: bool) -> None:
    """Measure `model` as `opts` say, write the profile to `out` and print its summary, then the
    warnings that concern planning with it (on stderr, beside --json too)."""
    from planner.hostinfo import usable_cores
    from planner.profiling.corun import check_co_run

    check_co_run(opts.co_run, opts.threads, usable_cores(), opts.device)
    from planner.profiling.profiler import measure_profile  # imports torch
    from planner.profiling.profile import write_profile

    with step_progress("profiling", percent=True) as on_step:
        result = measure_profile(model, opts, command="pplan " + shlex.join(sys.argv[1:]), on_step=on_step)
    sha = write_profile(result, out)
    summary = _summary(result, out, sha)
    if json_out:
        echo_json(summary)
    else:
        _print_table(summary)
    from planner.cost.model_flops import uncounted_flops_warning
    from planner.models.factory import few_layers_warning

    warning = few_layers_warning(result.n_layers, result.names)
    if warning:  # the profile is written, but no plan can cut it
        err(f"pplan: warning: {warning}")
    if (uncounted := uncounted_flops_warning(result)) is not None:
        err(f"pplan: warning: {uncounted}")

_MEASURING = ("device", "warmup", "repeats", "timer", "threads", "co_run")
"""What only a measured profile reads: an analytic one runs nothing and on no device (--seed it
records, for the plans' weights)."""


def _refuse_unused(ctx: typer.Context, analytic: bool) -> None:
    """--hardware without --analytic, or a measuring flag with it, would be silently ignored (a
    `--device cuda --hardware h100-80gb` profile was computed, not measured, with exit code 0)."""
    given = given_params(ctx)
    if not analytic and "hardware" in given:
        raise PplanError(f"--hardware {ctx.params['hardware']!r} without --analytic: a measured profile runs on "
                         f"--device ({ctx.params['device']}), not on a hardware preset",
                         "add --analytic to compute the profile for that hardware, or drop --hardware")
    unused = [name for name in _MEASURING if name in given] if analytic else []
    if unused:
        shown = ", ".join(f"--{name.replace('_', '-')} {ctx.params[name]}" for name in unused)
        raise PplanError(f"{shown} with --analytic: an analytic profile is computed from FLOPs and bytes, "
                         "not measured", f"drop {'it' if len(unused) == 1 else 'them'}, or drop --analytic to measure")


def _analytic(model: str, sizes: list[int], hardware: str | None, dtype: str, out: Path, json_out: bool, seed: int) -> None:
    """`--analytic`: the roofline profile of planner.profiling.analytic, no torch imported."""
    from planner.profiling.analytic import write_analytic_profile

    if hardware is None:
        raise PplanError("--analytic needs --hardware", "e.g. --hardware a100-80gb (see `pplan hardware`)")
    from planner.atomic import ensure_outputs_distinct

    ensure_outputs_distinct([("--out", out)], [("hardware file", Path(hardware) if Path(hardware).is_file() else None)])
    result = write_analytic_profile(model, hardware, dtype, sizes, out, command="pplan " + shlex.join(sys.argv[1:]), seed=seed)
    summary = _summary(result, out, result.sha256)
    if json_out:
        echo_json(summary)
    else:
        typer.echo(f"wrote {out}: analytic profile of {model} on {hardware} ({dtype}), {result.n_layers} layers, "
                   f"micro-batch sizes {','.join(map(str, sizes))}")
