"""`pplan bench`: rerunnable benchmarks; each prints a table and writes CSV + Markdown.

    pplan bench planner     DP vs ILP seconds over layers x devices
    pplan bench published   predicted vs published TFLOP/s per GPU of large data x pipeline x tensor runs
    pplan bench simulator   simulated actions per second per schedule
    pplan bench quality     pplan vs uniform/params/time baselines (--measured: on the executor)
    pplan bench fidelity    predicted vs measured step time and peak memory (--quick: tiny grid)
    pplan bench handover    what a hand-over between two CPU ranks costs, idle and while both compute

Progress goes to stderr; the table to stdout (or JSON with --json); files to --out-dir, written
atomically once the bench has finished. The default, reports/bench-latest/, is git-ignored, so a
bench run leaves the checkout clean; `--out-dir reports/bench` regenerates the committed
reference reports (docs/bench.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from cli.common import echo_json, err, given_params, parse_int_list, timed_say
from planner.errors import PplanError

__all__ = ["register"]

bench_app = typer.Typer(help="Benchmarks anyone can rerun: tables on stdout, CSV + Markdown under reports/bench-latest/ "
                        "(git-ignored; --out-dir reports/bench rewrites the committed reference reports).",
                        no_args_is_help=True, rich_markup_mode=None)

_OutDir = Annotated[Path, typer.Option("--out-dir", help="Folder for the CSV and Markdown tables (the default is "
                                        "git-ignored; reports/bench holds the committed reference reports).")]
_Json = Annotated[bool, typer.Option("--json", help="Print the tables and the machine as JSON instead of text.")]
# Untracked by default (.gitignore): running a bench must not dirty the committed reports/bench/.
BENCH_DEFAULT_DIR = Path("reports/bench-latest")

# One line each in `pplan bench --help`, whole at 80 columns (click would cut the docstrings at ~50
# characters, as for the top-level commands: cli/app.py SHORT_HELP).
BENCH_SUMMARIES = {
    "planner": "Seconds to cut a model into stages: DP vs ILP, and the 3D search.",
    "simulator": "Simulated actions per second for gpipe, 1f1b, interleaved and zb.",
    "published": "Predicted vs published TFLOP/s of Megatron-LM and BLOOM-176B.",
    "quality": "pplan vs uniform, params and time baselines; --measured: trained.",
    "fidelity": "Predicted vs measured step time and peak memory; fidelity.png.",
    "handover": "Cost of a gloo hand-over between two CPU ranks, idle and busy.",
}


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")


def _finish(tables: list[Any], out_dir: Path, as_json: bool, machine: dict[str, Any],
            figures: tuple[tuple[str, Callable[[str], None]], ...] = ()) -> None:
    """Write every output, figures (name, draw(path)) first, then list them all: a figure that
    fails to draw leaves no table behind, and --json's `files` names each file written."""
    from planner.bench import table_text, write_table
    from planner.errors import PplanError

    if out_dir.exists() and not out_dir.is_dir():
        raise PplanError(f"--out-dir {str(out_dir)!r} is a file", "give a folder, e.g. reports/bench")
    written: list[Path] = []
    for name, draw in figures:
        draw(str(out_dir / name))  # atomic: a failed drawing leaves no file
        written.append(out_dir / name)
    written += [p for t in tables for p in write_table(t, out_dir, machine)]
    if as_json:
        echo_json({"machine": machine, "tables": [t.as_dict() for t in tables], "files": [str(p) for p in written]})
        return
    for t in tables:
        typer.echo(table_text(t, t.terminal_columns or None))
        files = [str(p) for p in written if p.name in (f"{t.name}.csv", f"{t.name}.md")]
        if t.terminal_columns and files:  # a wide table's terminal view: say where the rest is
            typer.echo(f"note: {len(t.terminal_columns)} of {len(t.columns)} columns shown; every column is in "
                       f"{' and '.join(files)} (and --json).")
    for p in written:
        err(f"wrote {p}")


def _progress() -> Callable[[str], None]:
    return timed_say("bench")


def _machine() -> dict[str, Any]:
    from planner.bench import machine_info

    return machine_info()


def _list_option(text: str, what: str, example: str) -> str:
    """`text` unchanged; PplanError when an item of the comma list is empty ('4,,16', '8x64,'), named
    as such for the bench's list options (--models is a list of names no other parser reads; the
    number parsers refuse an empty item too, in their general words)."""
    if "," in text and any(not item.strip() for item in text.split(",")):
        raise PplanError(f"{what} {text[:80]!r} has an empty item between commas", f"write it like {what} {example}")
    return text


def _check_out(out_dir: Path) -> None:
    """Refuse, before the bench runs, a folder its tables could not be written to."""
    from planner.atomic import ensure_writable_dir
    from planner.errors import PplanError

    if out_dir.exists() and not out_dir.is_dir():
        raise PplanError(f"--out-dir {str(out_dir)!r} is a file", "give a folder, e.g. reports/bench")
    ensure_writable_dir(out_dir, "--out-dir")


@bench_app.command("planner", short_help=BENCH_SUMMARIES["planner"])
def planner_cmd(
    layers: Annotated[str, typer.Option("--layers", help="Layer counts to plan.")] = "50,200,1000",
    devices: Annotated[str, typer.Option("--devices", help="Device counts to plan for.")] = "4,16,64",
    ilp_time_limit: Annotated[float, typer.Option("--ilp-time-limit", help="Seconds per ILP solve before it counts as impractical (positive and finite).")] = 20.0,
    parallel: Annotated[bool, typer.Option(
        "--parallel/--no-parallel", help="Also time the full dp x pp x tp search for "
        "GPT-175B on 1,536 and GPT-1T on 3,072 A100s (targets 5 s and 10 s).")] = True,
    out_dir: _OutDir = BENCH_DEFAULT_DIR, as_json: _Json = False,
) -> None:
    """Seconds to solve one stage-cut problem (DP vs ILP over layers x devices), and the 3D search at scale."""
    from planner.bench import bench_planner
    from planner.bench.parallel_bench import bench_parallel

    from planner.bench.planner_bench import check_grid
    from planner.limits import check_time_limit

    # bounded before the 3D search below runs: a refusal comes first, not after minutes
    layer_counts, device_counts = check_grid(parse_int_list(_list_option(layers, "--layers", "50,200,1000"), "--layers"),
                                             parse_int_list(_list_option(devices, "--devices", "4,16,64"), "--devices"))
    check_time_limit(ilp_time_limit, "--ilp-time-limit")  # inf would let CBC run unlimited
    _check_out(out_dir)
    machine = _machine()
    tables = [bench_planner(layer_counts, device_counts, ilp_time_limit=ilp_time_limit, progress=_progress())]
    if parallel:
        tables.append(bench_parallel(progress=_progress()))
    _finish(tables, out_dir, as_json, machine)


@bench_app.command("simulator", short_help=BENCH_SUMMARIES["simulator"])
def simulator_cmd(
    sizes: Annotated[str, typer.Option("--sizes", help="STAGESxMICROBATCHES list.")] = "8x64,32x256,64x1024",
    repeats: Annotated[int, typer.Option("--repeats", help="Warm simulations per cell (the best is reported).")] = 3,
    repeat_alias: Annotated[Optional[int], typer.Option("--repeat", hidden=True, help="Old spelling of --repeats.")] = None,
    out_dir: _OutDir = BENCH_DEFAULT_DIR, as_json: _Json = False,
) -> None:
    """Simulated actions per second for gpipe, 1f1b, interleaved and zb."""
    from planner.bench import bench_simulator, parse_sizes
    from planner.bench.simulator_bench import check_repeats, check_sizes

    check_repeats(repeats if repeat_alias is None else repeat_alias)  # bench_simulator checks them too: refused before --out-dir
    parsed = check_sizes(parse_sizes(_list_option(sizes, "--sizes", "8x64,32x256")))
    _check_out(out_dir)
    machine = _machine()
    table = bench_simulator(parsed, repeat=repeats if repeat_alias is None else repeat_alias, progress=_progress())
    _finish([table], out_dir, as_json, machine)


@bench_app.command("published", short_help=BENCH_SUMMARIES["published"])
def published_cmd(out_dir: _OutDir = BENCH_DEFAULT_DIR, as_json: _Json = False) -> None:
    """Predict published large runs (Megatron-LM weak scaling, BLOOM-176B) from their settings; error per row."""
    from planner.bench.published import published_table

    _check_out(out_dir)
    machine = _machine()
    _finish([published_table()], out_dir, as_json, machine)


_MEASURED_ONLY = ("steps", "warmup", "device")
"""What only `bench quality --measured` reads: the simulated comparison trains nothing."""


def _refuse_unmeasured(ctx: typer.Context, measured: bool) -> None:
    """A run setting without --measured would be silently ignored (`--steps 7` exited 0 while
    `--steps 2` was refused), as `pplan profile --analytic` refuses its measuring flags."""
    unused = [name for name in _MEASURED_ONLY if name in given_params(ctx)] if not measured else []
    if unused:
        shown = ", ".join(f"--{name} {ctx.params[name]}" for name in unused)
        raise PplanError(f"{shown} without --measured: the simulated comparison trains nothing",
                         f"add --measured to also train the plans, or drop {'it' if len(unused) == 1 else 'them'}")


@bench_app.command("quality", short_help=BENCH_SUMMARIES["quality"])
def quality_cmd(
    ctx: typer.Context,
    profiles: Annotated[Optional[list[Path]], typer.Argument(
        metavar="PROFILE.csv", help="Profiles to compare on (default: every CSV under profiles/).")] = None,
    devices: Annotated[str, typer.Option("--devices", help="Device counts.")] = "2,4,8",
    global_batch: Annotated[int, typer.Option("--global-batch", help="Samples per iteration.")] = 32,
    measured: Annotated[bool, typer.Option("--measured", help="Also train the plans on the executor (gpt on 2, synthetic on 2 and 4).")] = False,
    steps: Annotated[int, typer.Option("--steps", help="--measured: steps per run.")] = 5,
    warmup: Annotated[int, typer.Option("--warmup", help="--measured: untimed first steps.")] = 2,
    device: Annotated[str, typer.Option("--device", help="--measured: cpu or cuda (each rank on cuda:LOCAL_RANK).")] = "cpu",
    out_dir: _OutDir = BENCH_DEFAULT_DIR, as_json: _Json = False,
) -> None:
    """pplan against the uniform, params and time baselines (simulated; --measured on the executor)."""
    from planner.bench import bench_quality, bench_quality_measured

    from planner.bench.planner_bench import check_counts
    from planner.bench.quality import check_runs
    from planner.limits import MAX_GLOBAL_BATCH
    from planner.plan.records import MAX_PIPELINE_STAGES

    _refuse_unmeasured(ctx, measured)
    device_counts = check_counts(parse_int_list(_list_option(devices, "--devices", "2,4,8"), "--devices"),
                                 "--devices", MAX_PIPELINE_STAGES, "2,4,8")
    if not 1 <= global_batch <= MAX_GLOBAL_BATCH:
        raise PplanError(f"--global-batch {global_batch} is outside 1..{MAX_GLOBAL_BATCH:,}", "e.g. --global-batch 32")
    _check_out(out_dir)
    if measured:  # bench_quality_measured checks them too; here before the simulated bench runs
        check_runs(steps, warmup, device)
    if profiles:  # a profile given from the tables' folder must not be overwritten by a table
        from planner.atomic import ensure_outputs_distinct

        ensure_outputs_distinct([(f"--out-dir's {name}", out_dir / name) for name in
                                 ("quality.csv", "quality.md", "quality_measured.csv", "quality_measured.md")],
                                [("profile", p) for p in profiles])
    machine = _machine()
    tables = [bench_quality(profiles or None, device_counts, global_batch, progress=_progress())]
    if measured:
        tables.append(bench_quality_measured(steps=steps, warmup=warmup, device=device, progress=_progress()))
    _finish(tables, out_dir, as_json, machine)


@bench_app.command("fidelity", short_help=BENCH_SUMMARIES["fidelity"])
def fidelity_cmd(
    quick: Annotated[bool, typer.Option("--quick", help="A tiny grid (2 runs): checks the pipeline, not the figures.")] = False,
    steps: Annotated[int, typer.Option("--steps", help="Steps per run.")] = 5,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed first steps.")] = 2,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda (each rank on cuda:LOCAL_RANK).")] = "cpu",
    repeats: Annotated[int, typer.Option("--repeats", help="Runs per case: the error's median and spread over them.")] = 1,
    calibrated: Annotated[bool, typer.Option(
        "--calibrated", help="Also per-plan calibration (needs --repeats 2 or more): each "
        "case's first run calibrates as `pplan run --calibrate`, the others are predicted with it "
        "(column cal_time_err_pct).")] = False,
    models: Annotated[Optional[str], typer.Option(
        "--models", help="Only these groups of the grid, e.g. gpt,mlp "
        "(synthetic, gpt, mlp, resnet, hf-gpt2; default all). Not with --quick, whose grid is one "
        "fixed synthetic group.")] = None,
    out_dir: _OutDir = BENCH_DEFAULT_DIR, as_json: _Json = False,
) -> None:
    """Predicted vs measured step time and peak memory over models x schedules x devices; draws fidelity.png.

    Real models on CPU are profiled beside devices - 1 co-running processes (`pplan profile --co-run`,
    column co_run), as their runs' other ranks share this machine's memory bandwidth."""
    from planner.bench import DEFAULT_GRID, QUICK_GRID, bench_fidelity
    from planner.bench.fidelity import fidelity_figure, select_grid
    from planner.bench.quality import check_runs
    from planner.bench.simulator_bench import check_repeats

    if quick and models is not None:  # QUICK_GRID is not filtered: --models would be ignored
        raise PplanError(f"--models {models[:60]!r} with --quick: the quick grid is one fixed synthetic group",
                         "drop --models, or drop --quick to run only those groups of the full grid")
    check_repeats(repeats)
    check_runs(steps, warmup, device)
    grid = QUICK_GRID if quick else select_grid(models and _list_option(models, "--models", "gpt,mlp"), DEFAULT_GRID)
    _check_out(out_dir)
    machine = _machine()
    table = bench_fidelity(grid, steps=steps, warmup=warmup, device=device,
                           progress=_progress(), repeats=repeats, calibrated=calibrated)
    _finish([table], out_dir, as_json, machine, figures=(("fidelity.png", lambda path: fidelity_figure(table, path, machine)),))


@bench_app.command("handover", short_help=BENCH_SUMMARIES["handover"])
def handover_cmd(
    quick: Annotated[bool, typer.Option("--quick", help="One size, a few exchanges: checks the bench, not the figures.")] = False,
    out_dir: _OutDir = BENCH_DEFAULT_DIR, as_json: _Json = False,
) -> None:
    """Cost of one gloo hand-over between two local ranks: idle, and while both ranks compute (every core busy)."""
    from planner.bench.handover import FULL, QUICK, bench_handover

    _check_out(out_dir)
    machine = _machine()
    table = bench_handover(QUICK if quick else FULL, progress=_progress())
    _finish([table], out_dir, as_json, machine)
