"""Hardware you may not have: accelerator presets and user JSON files, without torch.

A `Hardware` is one device (GPU, or one CPU core) and the links around it: peak dense FLOP/s
in 16-bit and 32-bit, memory capacity and bandwidth, link bandwidth within a node and between
nodes, and message latencies. Presets (`PRESETS`) come from vendor datasheets (docs/hardware.md
lists the sources); a user file has the same keys as `pplan hardware NAME --json` prints:

    {"format": "pplan-hardware/1", "name": "my-gpu",
     "peak_bf16_flops_per_s": 312e12, "peak_fp32_flops_per_s": 19.5e12,
     "memory_bytes": "80GiB", "memory_bandwidth_bytes_per_s": "2TB/s",
     "intra_node_bandwidth_bytes_per_s": "300GB/s", "inter_node_bandwidth_bytes_per_s": "200Gbit/s",
     "intra_node_latency_ms": 0.01, "inter_node_latency_ms": 0.02, "gpus_per_node": 8,
     "source": "where the numbers come from"}

Sizes, bandwidths and latencies may be plain numbers (bytes, bytes/s, ms) or strings with
units (planner.units); `format` and `source` are optional. Unknown keys are refused with the
nearest known one; every value must be finite and within a plausible range (peak FLOP/s 1e9..1e18,
memory 64 MiB..1 PiB, bandwidths 1e6..1e15 bytes/s, latencies 0..1000 ms, 1..4096 GPUs per node):
outside it a value is a unit mistake, such as 989 written for 989 TFLOP/s.

A data/tensor-parallel plan records the hardware it was planned on under the same keys
(`parallel.hardware_spec`, read back by hardware_from_dict), so a file that kept a preset's name
(`pplan hardware h100-80gb --json > my.json`, edited) is priced with its own values, not the preset's.
"""

from __future__ import annotations

import math
import os
import types
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from planner.errors import ClusterError, PplanError
from planner.jsonio import check_keys, nearest, read_json_file
from planner.limits import MAX_BANDWIDTH, MIN_LINK_BANDWIDTH
from planner.textsafe import printable, terminal_safe
from planner.units import parse_bandwidth, parse_bytes, parse_ms, plain_float

__all__ = ["FORMAT", "Hardware", "PRESETS", "DTYPE_BYTES", "MEMORY_BOUND_FRACTION", "MAX_GPUS_PER_NODE", "load_hardware", "hardware_from_dict"]

FORMAT = "pplan-hardware/1"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of the dtypes pplan profiles in."""
MEMORY_BOUND_FRACTION = 0.8
"""Fraction of peak memory bandwidth that memory-bound kernels (norms, elementwise) reach: the
analytic profiles' roofline and the tensor-parallel cost of the kernels tp leaves whole both use it."""
_MAX_FILE_BYTES = 1 << 20  # a hardware file is a few hundred bytes


@dataclass(frozen=True)
class Hardware:
    """One device and its links, in SI units (bytes, bytes/s, FLOP/s, ms)."""

    name: str
    """Short identifier, e.g. `a100-80gb` (written into analytic profiles)."""
    peak_bf16_flops_per_s: float
    """Peak dense bf16/fp16 tensor FLOP/s (no sparsity)."""
    peak_fp32_flops_per_s: float
    """Peak dense fp32 FLOP/s without TF32 (torch's default for matmuls)."""
    memory_bytes: int
    """Device memory capacity, bytes."""
    memory_bandwidth_bytes_per_s: float
    """Peak device memory bandwidth, bytes/s."""
    intra_node_bandwidth_bytes_per_s: float
    """Link bandwidth to another device of the same node, bytes/s per direction."""
    inter_node_bandwidth_bytes_per_s: float
    """Network bandwidth to other nodes, bytes/s per device per direction."""
    intra_node_latency_ms: float
    """Latency of one message within a node, ms."""
    inter_node_latency_ms: float
    """Latency of one message between nodes, ms."""
    gpus_per_node: int
    """Devices per node by default."""
    source: str
    """Where the numbers come from (datasheet, measurement)."""

    def __post_init__(self) -> None:
        where = f"hardware {str(self.name)[:60]!r}"
        _text(self.name, "name", where, True)
        _text(self.source, "source", where, False)
        for key in _REQUIRED[1:]:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ClusterError(f"{where}: {key} must be a number, got {str(value)[:60]!r}")
            _check_range(float(value), key, where)
            if key in ("gpus_per_node", "memory_bytes") and value != int(value):
                raise ClusterError(f"{where}: {key} must be a whole number, got {value:g}")

    def peak_flops_per_s(self, dtype: str) -> float:
        """Peak FLOP/s for matmuls in `dtype` (float32 -> fp32 peak, bfloat16/float16 -> 16-bit)."""
        if dtype == "float32":
            return self.peak_fp32_flops_per_s
        if dtype in ("bfloat16", "float16"):
            return self.peak_bf16_flops_per_s
        raise PplanError(f"dtype {dtype!r} is not supported", f"use one of {', '.join(DTYPE_BYTES)}")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this hardware (what a user file holds, and a plan's parallel.hardware_spec), format first."""
        return {"format": FORMAT, **asdict(self)}


# Plausible ranges: outside them a value is a typo or a unit mistake (989 for 989 TFLOP/s, 80 for
# 80 GB), and left alone it yields absurd predictions (an MFU of 10^12 %) or inf in the plan.
# The lower bounds sit far below any device pplan plans for (the `cpu` preset: 96 GFLOP/s,
# 12 GiB, 1.25 GB/s), the upper ones far above any chip.
_FLOPS_MIN, _FLOPS_MAX = 1e9, 1e18         # a GFLOP/s .. an exaFLOP/s per device
_BYTES_MIN, _BYTES_MAX = 2**26, 2**50      # 64 MiB .. a pebibyte of device memory
_BW_MIN, _BW_MAX = MIN_LINK_BANDWIDTH, MAX_BANDWIDTH  # a MB/s (a device's memory or link below it is a typo) .. parse_bandwidth's maximum
_LATENCY_MAX_MS = 1e3                      # a second per message
MAX_GPUS_PER_NODE = 4096
"""Most devices one node may hold (a hardware file's gpus_per_node, `--gpus-per-node`)."""
_TEXT_MAX = 500
_NAME_MAX = 200
"""Longest hardware name: a plan records it as parallel.hardware, which holds at most 200 characters
(planner.parallel); a longer name would be refused only when the search writes its plan."""
_REQUIRED = tuple(f.name for f in fields(Hardware) if f.name != "source")
_KNOWN = ("format",) + tuple(f.name for f in fields(Hardware))


def _number(raw: Any, key: str, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise ClusterError(f"{where}: {key} must be a number, got {str(raw)[:60]!r}")
    try:
        if key == "memory_bytes":
            return float(parse_bytes(raw, key))
        if key.endswith("_bandwidth_bytes_per_s"):
            return parse_bandwidth(raw)
        if key.endswith("_latency_ms"):
            return parse_ms(raw, "latency")  # not the key twice in one message; the file's own bound follows
        value = plain_float(raw) if isinstance(raw, str) else float(raw)
    except PplanError as e:
        raise ClusterError(f"{where}: {key}: {e.message}", e.hint) from None
    except ValueError:
        raise ClusterError(f"{where}: {key} {str(raw)[:60]!r} is not a number", "FLOP/s are plain numbers such as 312e12") from None
    return value


def _bounds(key: str) -> tuple[float, float, str, str]:
    """(lowest, highest, unit, how to write it) of a Hardware number field."""
    if key.startswith("peak_"):
        return _FLOPS_MIN, _FLOPS_MAX, "FLOP/s", "write FLOP/s, e.g. 9.89e14 for 989 TFLOP/s"
    if key == "memory_bytes":
        return _BYTES_MIN, _BYTES_MAX, "bytes", "write bytes or a size with units, e.g. 85899345920 or '80GiB'"
    if key.endswith("_bandwidth_bytes_per_s"):
        return _BW_MIN, _BW_MAX, "bytes/s", "write bytes/s or a rate with units, e.g. 3.35e12 or '3.35TB/s', '200Gbit/s'"
    if key.endswith("_latency_ms"):
        return 0.0, _LATENCY_MAX_MS, "ms", "write milliseconds or a time with units, e.g. 0.01 or '10us'"
    return 1.0, float(MAX_GPUS_PER_NODE), "devices", "give the devices in one node, e.g. 8"


def _check_range(value: float, key: str, where: str) -> None:
    low, high, unit, hint = _bounds(key)
    if not math.isfinite(value):
        raise ClusterError(f"{where}: {key} {value!r} is not finite", hint)
    if value < low:
        if key == "gpus_per_node" or low == 0:
            problem = f"must be at least {low:g}, got {value:g}"
        elif value <= 0:
            problem = f"must be positive, got {value:g}"
        else:
            problem = f"{value:g} {unit} is below {low:g} {unit}, less than any real device"
        raise ClusterError(f"{where}: {key} {problem}", hint)
    if value > high:
        raise ClusterError(f"{where}: {key} {value:g} {unit} is beyond any real device (limit {high:g} {unit})", hint)


def _text(raw: Any, key: str, where: str, required: bool) -> str:
    if not isinstance(raw, str) or (required and not raw.strip()):
        raise ClusterError(f"{where}: {key} must be a non-empty string")
    most = _NAME_MAX if key == "name" else _TEXT_MAX
    if len(raw) > most or not terminal_safe(raw):  # the name and source are printed (`pplan hardware`)
        raise ClusterError(f"{where}: {key} must be one line of at most {most} characters without control "
                           f"characters, got {printable(raw, 60)}", "write letters, digits, punctuation and spaces only")
    return raw.strip()


_GB, _GIB = 10**9, 2**30
_NVIDIA = "NVIDIA datasheet"
_DGX_A100 = "NVLink3 600 GB/s bidirectional; DGX A100: 8 GPUs, one 200 Gb/s HDR InfiniBand port per GPU"
# The 80 GB A100 and the H200 differ from their siblings only in memory: derived, so they cannot drift.
_A100_40GB = Hardware(
    "a100-40gb", 312e12, 19.5e12, 40 * _GB, 1.555e12, 300e9, 25e9, 0.01, 0.02, 8,
    f"{_NVIDIA} A100 SXM4 40GB (HBM2 1,555 GB/s); {_DGX_A100}")
_H100_80GB = Hardware(
    "h100-80gb", 989e12, 67e12, 80 * _GB, 3.35e12, 450e9, 50e9, 0.01, 0.02, 8,
    f"{_NVIDIA} H100 SXM5 80GB (HBM3 3.35 TB/s); NVLink4 900 GB/s bidirectional; DGX H100: 8 GPUs, one 400 Gb/s NDR InfiniBand port per GPU")
PRESETS: Mapping[str, Hardware] = types.MappingProxyType({
    "a100-40gb": _A100_40GB,
    "a100-80gb": replace(
        _A100_40GB, name="a100-80gb", memory_bytes=80 * _GB, memory_bandwidth_bytes_per_s=2.039e12,
        source=f"{_NVIDIA} A100 SXM4 80GB (HBM2e 2,039 GB/s); {_DGX_A100}"),
    "h100-80gb": _H100_80GB,
    "h200": replace(
        _H100_80GB, name="h200", memory_bytes=141 * _GB, memory_bandwidth_bytes_per_s=4.8e12,
        source=f"{_NVIDIA} H200 SXM 141GB (HBM3e 4.8 TB/s), compute and NVLink4 as H100 SXM; DGX H200: 8 GPUs, 400 Gb/s per GPU"),
    "cpu": Hardware(
        "cpu", 96e9, 96e9, 12 * _GIB, 16e9, 2.5e9, 1.25e9, 0.5, 0.5, 2,
        "generic x86-64 core, conservative: one core per device (pplan run gives each stage one thread), AVX2 2 FMA x 8 fp32 lanes "
        "x 2 FLOP at 3 GHz = 96 GFLOP/s, no bf16 matrix units (bf16 = fp32); half of a 2-core 24 GiB machine; 16 GB/s per-core "
        "DRAM stream; between processes gloo at 2.5 GB/s, 0.5 ms (pplan calibrate, 2026-11-29); 10 GbE between nodes"),
})
"""Built-in hardware by name (docs/hardware.md has the table and the sources)."""


def hardware_from_dict(data: Any, source: str = "<hardware>") -> Hardware:
    """Validate a parsed hardware JSON object (module docstring) into a Hardware."""
    if not isinstance(data, dict):
        raise ClusterError(f"{source}: a hardware file must be a JSON object", "print one with `pplan hardware a100-80gb --json`")
    check_keys(data, _KNOWN, source, ClusterError)
    if data.get("format", FORMAT) != FORMAT:
        raise ClusterError(f"{source}: format {str(data.get('format'))[:40]!r} is not supported (this pplan reads {FORMAT})")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ClusterError(f"{source}: missing key(s) {', '.join(missing)}", "print a complete example with `pplan hardware a100-80gb --json`")
    values: dict[str, Any] = {"name": _text(data["name"], "name", source, True)}
    for key in _REQUIRED[1:]:
        value = _number(data[key], key, source)
        _check_range(value, key, source)
        if key in ("gpus_per_node", "memory_bytes"):
            if value != int(value):
                raise ClusterError(f"{source}: {key} must be a whole number, got {value:g}")
            value = int(value)
        values[key] = value
    values["source"] = _text(data.get("source", f"user file {source}"), "source", source, False)
    return Hardware(**values)


def load_hardware(name_or_path: str | os.PathLike) -> Hardware:
    """A preset by name (`a100-80gb`, ...) or a user JSON file; ClusterError says what is wrong."""
    text = str(name_or_path)
    if text in PRESETS:
        return PRESETS[text]
    if not text.strip():  # Path('') is the current folder: it would be named as a directory given
        raise ClusterError("hardware name is empty", f"give a preset ({', '.join(PRESETS)}) or a hardware JSON file")
    looks_like_file = text.endswith(".json") or os.sep in text or "/" in text or Path(text).exists()
    if not looks_like_file:
        guess = nearest(text, PRESETS)
        hint = f"did you mean {guess!r}? " if guess else ""
        raise ClusterError(f"unknown hardware {text[:60]!r}", f"{hint}presets: {', '.join(PRESETS)}; or give a JSON file (see `pplan hardware`)")
    data = read_json_file(text, "hardware file", ClusterError, max_bytes=_MAX_FILE_BYTES)
    return hardware_from_dict(data, source=text)
