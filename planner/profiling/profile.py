"""The profile: per-layer time and memory at several micro-batch sizes, and its CSV format.

Format (version 1), UTF-8 CSV, one row per (layer, micro_batch_size):

    # format: pplan-profile/1          <- optional leading `# key: value` metadata lines
    # model: gpt:layers=4
    layer,name,micro_batch_size,fwd_ms,bwd_ms,param_bytes,activation_bytes,output_bytes[,optional...]

Units are milliseconds and bytes, all per micro-batch of `micro_batch_size` samples.
Optional columns (absent -> derived default): fwd_ms_std, bwd_ms_std, bwd_input_ms,
bwd_weight_ms (default: half of bwd_ms each), optimizer_ms (default 0), flops,
cuda_peak_bytes, shared_input_bytes (default 0: bytes of the layer's saved input that the
previous layer also saves, so a stage holding both keeps them once). Unknown extra columns
are ignored (and not written back). docs/profile-format.md has the full description.

A model that is not a chain adds one `# edge: <src>-><readers> <bytes_per_sample>` line per
skip tensor among the metadata (planner.graph.edges; docs/graph.md); a chain has none, so
its text is what it always was.

Loading validates everything a hand-edited file can get wrong and raises ProfileError with
the file, line and column. Modules: this one (the Profile and LayerCosts types, loading and
writing files), csvio (parsing and writing the CSV text), metadata (the `# key: value` lines).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from planner.atomic import atomic_write_text
from planner.errors import ProfileError
from planner.graph.crossing import crossing_bytes, layer_inputs
from planner.hardware import DTYPE_BYTES
from planner.jsonio import read_bounded_bytes
from planner.filekind import SNIFF_BYTES, wrong_kind
from planner.profiling.csvio import (
    FORMAT, INTEGER_COLUMNS, MAX_LAYERS, MAX_MICRO_BATCH_SIZE, MAX_ROWS, NUMERIC_COLUMNS, OPTIONAL_COLUMNS, REQUIRED_COLUMNS,
    ProfileTable, check_line_lengths, parse_profile_csv, profile_to_text,
)
from planner.profiling.metadata import META_KEYS

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "FORMAT",
    "REQUIRED_COLUMNS",
    "OPTIONAL_COLUMNS",
    "MAX_LAYERS",
    "MAX_ROWS",
    "MAX_PROFILE_BYTES",
    "MAX_MICRO_BATCH_SIZE",
    "META_KEYS",
    "LayerCosts",
    "Profile",
    "load_profile",
    "make_profile",
    "profile_from_bytes",
    "profile_to_text",
    "read_profile_text",
    "write_profile",
]

# MAX_ROWS rows of up to ~250 bytes (every optional column, long layer names) is 250 MB; a
# real profile is far smaller (4,000 layers x 16 sizes x 130 bytes = 8 MB). Anything larger
# (or a device, a FIFO) is not a profile, and 256 MiB still reads and validates in seconds.
MAX_PROFILE_BYTES = 256 * 1024 * 1024
_MAKE_PROFILE = "a profile is the CSV `pplan profile` writes (docs/profile-format.md)"


@dataclass(frozen=True)
class LayerCosts:
    """Per-layer costs at one micro-batch size, as numpy arrays of length n_layers."""

    micro_batch_size: int
    """Samples per micro-batch these costs describe."""
    fwd_ms: np.ndarray
    """Forward time of each layer, ms."""
    bwd_ms: np.ndarray
    """Full backward time of each layer, ms."""
    bwd_input_ms: np.ndarray
    """Input-gradient half of the backward (zero-bubble I), ms."""
    bwd_weight_ms: np.ndarray
    """Weight-gradient half of the backward (zero-bubble W), ms."""
    optimizer_ms: np.ndarray
    """Optimizer step time for each layer's parameters, ms (0 when not measured)."""
    param_bytes: np.ndarray
    """Parameter bytes of each layer."""
    activation_bytes: np.ndarray
    """Bytes each layer keeps for its backward, per micro-batch."""
    output_bytes: np.ndarray
    """Bytes of each layer's output per micro-batch (what crosses a cut after it)."""
    input_bytes: float
    """Bytes of the model's input per micro-batch (0 when the profile does not say)."""
    interpolated: bool
    """True when micro_batch_size was not measured: interpolated, or extrapolated outside the measured
    sizes (Profile.size_basis tells which)."""
    shared_input_bytes: np.ndarray | None = None
    """Bytes of each layer's saved input also saved by the layer before (count once within a stage)."""
    skip_edges: tuple = ()
    """Skip edges of a non-chain model (planner.graph.SkipEdge, bytes per sample); () for a chain."""
    crossing_bytes: np.ndarray | None = None
    """Length n_layers-1: bytes crossing the cut after each layer, skip tensors included (None: a chain, output_bytes[:-1])."""
    layer_input_bytes: np.ndarray | None = None
    """Per layer, bytes it reads from earlier layers (layer 0: input_bytes), what a checkpoint keeps (None: a chain)."""
    workspace_bytes: np.ndarray | None = None
    """Bytes alive at each layer's worst moment beyond what it keeps and its output: gradients, temporaries (None: 0)."""
    output_saved_bytes: np.ndarray | None = None
    """Bytes of each layer's output it saves itself for backward (None: unknown, taken as all of it)."""
    optimizer_workspace_bytes: np.ndarray | None = None
    """Temporaries of one Adam step over each layer's parameters (None: 0)."""
    input_saved_bytes: np.ndarray | None = None
    """Bytes of each layer's input it saves itself for backward (None: unknown; the cost model then
    charges boundary buffers as it did before the column existed, planner.cost.memory)."""
    wgrad_bytes: np.ndarray | None = None
    """Bytes zero-bubble's input backward keeps per micro-batch for its weight backward beyond the
    saved activations (planner.profiling.split_backward; None: not measured, 0)."""
    checkpoint_extra_bytes: np.ndarray | None = None
    """Bytes a checkpointed layer keeps per micro-batch besides its input: the checkpoint's RNG state
    and, on the last layer, the loss's saved tensors (planner.profiling.saved; None: not measured, 0)."""
    w_workspace_bytes: np.ndarray | None = None
    """The allocator's peak during each layer's weight backward (zero-bubble W) alone, its parameter
    gradients already there: fresh weight gradients and temporaries (split_backward; None: not measured, 0)."""
    w_carry_bytes: np.ndarray | None = None
    """Bytes of the weight gradients of each layer's last parameter group, which W still holds while
    the stage's next layer's runs; the same at every size (split_backward; None: not measured, 0)."""
    target_bytes: float = 0.0
    """Bytes of the training target per micro-batch, which the last stage holds for the whole step
    (planner.cost.batch; 0 when the profile does not say: profiles made before pplan recorded it)."""
    param_element_bytes: float = 4.0
    """Bytes per parameter in param_bytes, from the profile's `# dtype` (none: float32, as `pplan run`
    trains it): a 16-bit model trains through fp32 master weights (planner.cost.optimizer_factor)."""


@dataclass(frozen=True)
class Profile(ProfileTable):
    """A validated profile: columns as (n_layers, n_sizes) arrays, sizes ascending (fields of
    ProfileTable: names, micro_batch_sizes, columns, present, meta, skip_edges), and its file."""

    path: str | None = None
    """Where it was loaded from, if anywhere."""
    sha256: str | None = None
    """Checksum of the file's bytes (plans record it)."""

    @property
    def n_layers(self) -> int:
        return len(self.names)

    @property
    def input_bytes_per_sample(self) -> float:
        return self._meta_number("input_bytes_per_sample")

    @property
    def target_bytes_per_sample(self) -> float:
        """Bytes of one sample of the training target (0 for profiles that do not say)."""
        return self._meta_number("target_bytes_per_sample")

    def _meta_number(self, key: str) -> float:
        try:  # validated at load; a Profile built in code may hold anything
            return float(self.meta.get(key, 0) or 0)
        except ValueError:
            return 0.0

    def size_basis(self, micro_batch_size: int) -> str:
        """How `at` gets the costs of `micro_batch_size`: "measured", "interpolated" between two
        measured sizes, or "extrapolated" beyond them (scaled from the nearest: 32 from 2 and 4
        is an 8x extrapolation, which a message must not call an interpolation)."""
        if micro_batch_size in self._position:
            return "measured"
        sizes = self.micro_batch_sizes
        return "interpolated" if sizes[0] < micro_batch_size < sizes[-1] else "extrapolated"

    def size_note(self, micro_batch_size: int) -> str:
        """The basis for messages: "" when measured, else e.g. "costs extrapolated from the measured sizes 2, 4"."""
        basis = self.size_basis(micro_batch_size)
        return "" if basis == "measured" else f"costs {basis} from the measured sizes {', '.join(map(str, self.micro_batch_sizes))}"

    def at(self, micro_batch_size: int) -> LayerCosts:
        """Costs at `micro_batch_size`: exact rows if measured, else interpolated.

        Between measured sizes every column is linear in the size; beyond the largest (or
        below the smallest) times and bytes scale proportionally from the nearest measured
        size, which is what a layer does once it saturates the device.
        """
        if micro_batch_size < 1:
            raise ProfileError(f"micro-batch size {micro_batch_size} must be at least 1")
        interpolated = micro_batch_size not in self._position
        cols = {name: self._column_at(name, micro_batch_size) for name in (
            "fwd_ms", "bwd_ms", "bwd_input_ms", "bwd_weight_ms", "optimizer_ms",
            "activation_bytes", "output_bytes", "shared_input_bytes", "workspace_bytes",
            "output_saved_bytes", "optimizer_workspace_bytes", "input_saved_bytes", "wgrad_bytes",
            "checkpoint_extra_bytes", "w_workspace_bytes", "w_carry_bytes")}
        # unknown: the older memory model (planner.cost.memory), or a term counted as 0
        for unknown in ("output_saved_bytes", "input_saved_bytes", "wgrad_bytes", "checkpoint_extra_bytes",
                        "w_workspace_bytes", "w_carry_bytes"):
            if unknown not in self.present:
                cols[unknown] = None
        input_bytes = self.input_bytes_per_sample * micro_batch_size
        graph: dict = {}
        if self.skip_edges:  # a chain keeps exactly the arrays (and code path) it always had
            out, edges, n = cols["output_bytes"], self.skip_edges, self.n_layers
            graph = {"skip_edges": edges, "crossing_bytes": crossing_bytes(n, out, edges, micro_batch_size),
                     "layer_input_bytes": layer_inputs(n, out, edges, micro_batch_size, input_bytes)}
        return LayerCosts(
            micro_batch_size=micro_batch_size,
            param_bytes=self.columns["param_bytes"][:, 0].copy(),
            input_bytes=input_bytes,
            target_bytes=self.target_bytes_per_sample * micro_batch_size,
            param_element_bytes=float(DTYPE_BYTES.get(str(self.meta.get("dtype") or "float32"), 4)),
            interpolated=interpolated,
            **cols,
            **graph,
        )

    def to_frame(self) -> "pd.DataFrame":
        """The profile as a tidy pandas DataFrame for your own analysis: one row per layer x
        micro-batch size, with the CSV's columns (layer, name, micro_batch_size, then the numeric
        columns: times as float ms, bytes and flops as integers; optional columns the file lacks
        are left out). pandas is imported here only, so planning never loads it."""
        import pandas as pd

        n, k = self.n_layers, len(self.micro_batch_sizes)
        data: dict[str, object] = {
            "layer": np.repeat(np.arange(n), k),
            "name": np.repeat(np.array(self.names, dtype=object), k),
            "micro_batch_size": np.tile(np.array(self.micro_batch_sizes, dtype=np.int64), n),
        }
        for c in (*REQUIRED_COLUMNS[3:], *(c for c in OPTIONAL_COLUMNS if c in self.present)):
            values = self.columns[c].reshape(-1)
            data[c] = np.rint(values).astype(np.int64) if c in INTEGER_COLUMNS else values
        return pd.DataFrame(data)

    @functools.cached_property
    def _position(self) -> dict[int, int]:
        """Measured size -> its column (a dict: constant-time lookups however many sizes)."""
        return {s: k for k, s in enumerate(self.micro_batch_sizes)}

    def _column_at(self, name: str, b: int) -> np.ndarray:
        data = self.columns[name]
        sizes = self.micro_batch_sizes
        if name in ("optimizer_ms", "optimizer_workspace_bytes", "w_carry_bytes"):  # independent of the micro-batch size
            return data[:, 0].copy()
        k = self._position.get(b)
        if k is not None:
            return data[:, k].copy()
        if b < sizes[0]:
            return data[:, 0] * (b / sizes[0])
        if b > sizes[-1]:
            return data[:, -1] * (b / sizes[-1])
        hi = bisect.bisect_right(sizes, b)
        lo = hi - 1
        w = (b - sizes[lo]) / (sizes[hi] - sizes[lo])
        return data[:, lo] * (1 - w) + data[:, hi] * w


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_profile(path: str | os.PathLike) -> Profile:
    """Read and validate a profile CSV; ProfileError names file, line and column on failure.

    The file is read with a bound (MAX_PROFILE_BYTES): a FIFO, a device such as /dev/zero or
    an oversized file is refused before anything is read.
    """
    p = Path(path)
    try:
        data = read_bounded_bytes(p, "profile", ProfileError, MAX_PROFILE_BYTES)
    except ProfileError as e:
        if "does not exist" in e.message:
            raise ProfileError(e.message, "run `pplan profile` or pick a file under profiles/") from None
        raise
    return profile_from_bytes(data, str(p))


def profile_from_bytes(data: bytes, source: str) -> Profile:
    """Validate the bytes of a profile file read elsewhere (so a caller that hashes them reads once)."""
    if b"\x00" in data[:4096]:
        raise ProfileError(f"{source}: not a text CSV file (binary data)", "give a profile written by `pplan profile`")
    if (wrong := wrong_kind(source, data[:SNIFF_BYTES], "profile", _MAKE_PROFILE)) is not None:
        raise ProfileError(*wrong)  # a plan or run JSON, a timeline CSV: named, not "missing column(s)"
    if data[:SNIFF_BYTES].lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{"):
        raise ProfileError(f"{source} is JSON, not a profile CSV", _MAKE_PROFILE)
    check_line_lengths(data, source, ProfileError)  # before decoding makes a second, larger copy
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ProfileError(f"{source}: not UTF-8 text (byte {e.start})", "save the profile as UTF-8 CSV") from None
    return read_profile_text(text, source=source, sha256=_sha256(data))


def read_profile_text(text: str, source: str = "<profile>", sha256: str | None = None) -> Profile:
    """Parse and validate profile CSV text (see module docstring for the format)."""
    table = parse_profile_csv(text, source)
    return Profile(**{f.name: getattr(table, f.name) for f in fields(ProfileTable)},
                   path=None if source.startswith("<") else source, sha256=sha256 or _sha256(text.encode("utf-8")))


def write_profile(profile: Profile, path: str | os.PathLike) -> str:
    """Write `profile` atomically to `path`; returns the sha256 of what was written."""
    text = profile_to_text(profile)
    atomic_write_text(path, text)
    return _sha256(text.encode("utf-8"))


def make_profile(
    names: list[str],
    micro_batch_sizes: list[int],
    columns: dict[str, np.ndarray],
    meta: dict[str, str] | None = None,
    skip_edges: tuple = (),
) -> Profile:
    """Build a Profile from arrays (n_layers, n_sizes), validated by a text round-trip.

    Used by the profiler and by tests; routing through the CSV reader keeps one validator.
    `skip_edges` (planner.graph.SkipEdge or (src, dst, bytes_per_sample[, also_to]) tuples)
    become `# edge:` lines.
    """
    present = frozenset(c for c in OPTIONAL_COLUMNS if c in columns)
    draft = ProfileTable(
        names=tuple(names),
        micro_batch_sizes=tuple(micro_batch_sizes),
        columns={c: np.asarray(columns.get(c, np.zeros((len(names), len(micro_batch_sizes)))), dtype=float) for c in NUMERIC_COLUMNS},
        present=present,
        meta=dict(meta or {}),
        skip_edges=tuple(skip_edges),
    )
    return read_profile_text(profile_to_text(draft))
