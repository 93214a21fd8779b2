"""Built-in models (nn.Sequential of named pipeline layers) and `module:factory` loading.

`parse_spec` and `layer_count` (for built-ins) work without torch; `build_model` imports it.
See docs/models.md for the specs and the factory protocol.
"""

from planner.models.build import build_model, layer_count
from planner.models.bundle import ModelBundle
from planner.models.spec import BUILTIN_KINDS, describe_keys, parse_spec

__all__ = ["BUILTIN_KINDS", "ModelBundle", "build_model", "describe_keys", "layer_count", "parse_spec"]
