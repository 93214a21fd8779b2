"""`pplan hardware`: the hardware presets as a table, or one preset or user JSON file in full.

Thin: planner.hardware loads and validates; this prints. `--json` of one device prints
exactly the user-file format, so `pplan hardware a100-80gb --json > my.json` starts a custom one.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from cli.common import check_hardware_input, echo_json

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("hardware")(hardware_cmd)


def hardware_cmd(
    name: Annotated[Optional[str], typer.Argument(metavar="NAME|FILE.json", help="A preset name or a hardware JSON file (default: list the presets).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (one device: the user-file format).")] = False,
) -> None:
    """List the hardware presets (peak FLOP/s, memory, links), or show one preset or JSON file.

    Presets and the JSON format are described in docs/hardware.md; analytic profiles
    (`pplan profile --analytic --hardware NAME`) and cluster planning read them.
    """
    from planner.hardware import PRESETS, load_hardware

    if name is None:
        if as_json:
            echo_json([hw.to_dict() for hw in PRESETS.values()])
        else:
            _table(list(PRESETS.values()))
        return
    check_hardware_input(name)
    hw = load_hardware(name)
    if as_json:
        echo_json(hw.to_dict())
        return
    _table([hw])
    typer.echo(f"memory {hw.memory_bytes} bytes, {hw.gpus_per_node} per node, latency {hw.intra_node_latency_ms:g} ms "
               f"within a node, {hw.inter_node_latency_ms:g} ms between nodes")
    typer.echo(f"source: {hw.source}")


def _table(rows: list[Any]) -> None:
    width = max(4, *(len(hw.name) for hw in rows))
    typer.echo(f"{'name':<{width}}  {'bf16 TFLOP/s':>12}  {'fp32 TFLOP/s':>12}  {'memory GiB':>10}  {'mem BW TB/s':>11}  "
               f"{'intra GB/s':>10}  {'inter GB/s':>10}")
    for hw in rows:
        typer.echo(f"{hw.name:<{width}}  {hw.peak_bf16_flops_per_s / 1e12:>12.4g}  {hw.peak_fp32_flops_per_s / 1e12:>12.4g}  "
                   f"{hw.memory_bytes / 2**30:>10.1f}  {hw.memory_bandwidth_bytes_per_s / 1e12:>11.4g}  "
                   f"{hw.intra_node_bandwidth_bytes_per_s / 1e9:>10.4g}  {hw.inter_node_bandwidth_bytes_per_s / 1e9:>10.4g}")
