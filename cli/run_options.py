"""The options `pplan run` and `pplan calibrate` share: calibrate runs the plan exactly as
`pplan run --calibrate` does, so each option is declared once, here, and both commands take it.

Each is an `Annotated` type (see cli/options.py); a command gives the default in its signature.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

__all__ = [
    "Steps", "Warmup", "Lr", "RunOut", "RunTimeline", "RunProfile", "RunDevice", "CheckpointDir", "CheckpointEvery",
    "Timeout", "RankThreads", "Runtime", "Force", "Verbose", "RunJson", "VouchModel", "TrustModel", "RunInputShape",
    "RunInputDtype", "RunVocab",
]

Steps = Annotated[int, typer.Option(
    "--steps", help="Optimizer steps to train, at most 10,000,000 (a resumed run continues up to this count).")]
Warmup = Annotated[Optional[int], typer.Option(
    "--warmup", help="First steps left out of the timing, fewer than --steps (default 2, or --steps - 1 when fewer).")]
Lr = Annotated[float, typer.Option("--lr", help="Learning rate of the plan's optimizer.")]
RunOut = Annotated[Optional[Path], typer.Option("--out", "-o", help="Run JSON to write (measured vs predicted).")]
RunTimeline = Annotated[Optional[Path], typer.Option("--timeline", help="Measured timeline CSV of one step after warm-up.")]
RunProfile = Annotated[Optional[Path], typer.Option("--profile", help="Profile to predict with (default: the plan's).")]
RunDevice = Annotated[str, typer.Option("--device", help="cpu, cuda (each rank on cuda:LOCAL_RANK) or auto (cuda when this machine has a GPU for every local rank, else cpu).")]
CheckpointDir = Annotated[Optional[Path], typer.Option(
    "--checkpoint-dir", help="Save stage weights and optimizer state here; resume from the newest complete save.")]
CheckpointEvery = Annotated[int, typer.Option("--checkpoint-every", help="Also save every K steps (0: only at the end).")]
Timeout = Annotated[float, typer.Option("--timeout", help="Seconds a rank may wait for a peer before the run fails.")]
RankThreads = Annotated[int, typer.Option("--threads", help="torch threads per rank (0: cores / ranks; at most 4 per core).")]
Runtime = Annotated[str, typer.Option(
    "--runtime", help="torch: torch's schedule classes where they run the planned order; plan: always the plan's action lists.")]
Force = Annotated[bool, typer.Option(
    "--force", help="Run despite a changed profile or more CPU ranks than the machine sensibly runs.")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Show every line the ranks print.")]
RunJson = Annotated[bool, typer.Option("--json", help="Print the run JSON instead of a summary.")]
VouchModel = Annotated[Optional[str], typer.Option(
    "--model", "-m", help="The plan's model spec, repeated to vouch for a module:factory model (it is imported and run).")]
TrustModel = Annotated[bool, typer.Option(
    "--trust-model", help="Import and run the plan's module:factory model without repeating it in --model.")]
RunInputShape = Annotated[Optional[str], typer.Option(
    "--input-shape", help="module:factory and hf: models: one sample's shape, e.g. 3,32,32 (default: the profile's).")]
RunInputDtype = Annotated[Optional[str], typer.Option(
    "--input-dtype", help="Factory models: float or long (default: the profile's).")]
RunVocab = Annotated[Optional[int], typer.Option(
    "--vocab", help="Factory models with long input: token ids below this (default: the profile's).")]
