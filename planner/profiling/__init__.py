"""Per-layer measurements: the Profile type and its CSV format (this package), measurement (`measure`, `profiler`, `saved`)."""

from planner.profiling.profile import (
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    LayerCosts,
    Profile,
    load_profile,
    read_profile_text,
    write_profile,
)

__all__ = [
    "OPTIONAL_COLUMNS",
    "REQUIRED_COLUMNS",
    "LayerCosts",
    "Profile",
    "load_profile",
    "read_profile_text",
    "write_profile",
]
