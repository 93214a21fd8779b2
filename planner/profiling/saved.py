"""What a layer keeps for backward: saved tensors counted once per storage, parameters excluded.

Autograd's saved_tensors_hooks see every tensor an op stores for its backward (custom
autograd Functions included). Several saved tensors often share one storage (q, k and v are
views of one projection output; a transposed weight is a view of the weight), so bytes are
counted per storage: what is really held. Parameters and buffers are excluded: they live for
the whole run whatever the schedule does, and the cost model counts them as weights.
"""

from __future__ import annotations

from typing import Any, Iterable, Self

import torch

__all__ = ["SavedTensorHooks", "SavedTensors", "storage_key", "tensor_bytes"]

_Key = tuple[str, int]


def storage_key(t: torch.Tensor) -> tuple[_Key, int]:
    """(identity of t's storage, its size in bytes)."""
    try:
        storage = t.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if ptr:
            return (str(t.device), ptr), nbytes
    except (RuntimeError, NotImplementedError):  # tensor subclasses without a plain storage
        pass
    return ("id", id(t)), t.numel() * t.element_size()


def tensor_bytes(obj: object) -> int:
    """Bytes of the values of a tensor, or of all tensors in a tuple/list/dict output."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (tuple, list)):
        return sum(tensor_bytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(tensor_bytes(o) for o in obj.values())
    return 0


class SavedTensorHooks:
    """Base of the context managers that watch what autograd saves for backward: inside `with`,
    every saved tensor passes through `pack` (which may wrap it) and back through `unpack`.
    `exclude`'s storages (parameters, buffers) are kept in `_exclude` for `pack` to skip."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self._exclude = {storage_key(t)[0] for t in exclude}
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None

    def pack(self, t: torch.Tensor) -> Any:
        """What autograd keeps in place of `t` (here `t` itself)."""
        return t

    def unpack(self, packed: Any) -> torch.Tensor:
        """The tensor `pack` returned `packed` for."""
        return packed

    def __enter__(self) -> Self:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._hooks is not None:
            self._hooks.__exit__(*exc)
            self._hooks = None


class SavedTensors(SavedTensorHooks):
    """Context manager recording the storages autograd saves inside it.

    The recorded tensors are kept referenced until `release()`, so a freed storage's address
    cannot be reused by a later tensor and be mistaken for the same storage.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        super().__init__(exclude)
        self.storages: dict[_Key, int] = {}
        self._held: list[torch.Tensor] = []

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """Record `t`'s storage (unless excluded) and keep `t` referenced."""
        key, nbytes = storage_key(t)
        if key not in self._exclude:
            self.storages[key] = max(nbytes, self.storages.get(key, 0))
            self._held.append(t)
        return t

    @property
    def total_bytes(self) -> int:
        """Bytes of all distinct saved storages."""
        return sum(self.storages.values())

    def shared_bytes(self, other: "SavedTensors | None") -> int:
        """Bytes of the storages saved both here and in `other`."""
        if other is None:
            return 0
        return sum(n for key, n in self.storages.items() if key in other.storages)

    def release(self) -> None:
        """Drop the references to the saved tensors."""
        self._held.clear()
