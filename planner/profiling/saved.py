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

__all__ = ["SavedTensorHooks", "SavedTensors", "storage_key", "tensor_bytes", "checkpoint_extra_bytes", "target_tensors"]

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

    def bytes_of(self, tensors: Iterable[torch.Tensor]) -> int:
        """Bytes of the storages of `tensors` that were saved here, each once."""
        return sum(self.storages.get(key, 0) for key in {storage_key(t)[0] for t in tensors})

    def held_bytes_of(self, tensors: Iterable[torch.Tensor]) -> int:
        """Bytes of `tensors` (a layer's outputs, or its inputs) whose storage was saved here: a pipeline
        runtime that holds a stage's output until its backward, or receives its input into a buffer of
        its own, holds these anyway. Each tensor's own bytes (a view counts its part), a storage once."""
        seen: dict[_Key, int] = {}
        for t in tensors:
            key = storage_key(t)[0]
            if key in self.storages:
                seen[key] = max(tensor_bytes(t), seen.get(key, 0))
        return sum(seen.values())

    def shared_bytes(self, other: "SavedTensors | None") -> int:
        """Bytes of the storages saved both here and in `other`."""
        if other is None:
            return 0
        return sum(n for key, n in self.storages.items() if key in other.storages)

    def release(self) -> None:
        """Drop the references to the saved tensors."""
        self._held.clear()


def target_tensors(target: Any) -> list[torch.Tensor]:
    """The tensors of a training target: a tensor, or those in a tuple or list of them.

    The loss saves its target micro-batch for backward (F.mse_loss the regression target, cross-entropy
    the class ids). In a run that is a view of the step's target batch, which the last stage holds for
    the whole step and planner.cost.batch charges once (the profile's target_bytes_per_sample), so the
    profiler leaves it out of the last layer's activation_bytes and checkpoint_extra_bytes; else
    GPipe's M micro-batches in flight charge the batch twice (measured: a last rank predicted at
    7.5 MiB ran at 5.8 MiB, 8 micro-batches of 8 x 16 x 500 float targets)."""
    if isinstance(target, (tuple, list)):
        return [t for o in target for t in target_tensors(o)]
    return [target] if isinstance(target, torch.Tensor) else []


def checkpoint_extra_bytes(output: Any, loss_fn: Any = None, target: Any = None) -> int:
    """Bytes a checkpointed layer keeps per micro-batch besides its input: the RNG state
    torch.utils.checkpoint saves at every call (preserve_rng_state: the CPU generator's, and the
    device's when `output` is on one; 5,056 bytes on CPU with torch 2.13), and with `loss_fn` (the
    last layer) what the loss saves for its backward: the pipeline runtime computes the loss
    outside the stage, so outside any checkpoint, and keeps it from forward to backward. The target
    it saves is not counted: the last stage holds the step's targets anyway (planner.cost.batch)."""
    first = output[0] if isinstance(output, tuple) else output
    extra = torch.get_rng_state().nbytes
    if isinstance(first, torch.Tensor) and first.device.type == "cuda":
        extra += torch.cuda.get_rng_state(first.device).nbytes
    if loss_fn is None or not isinstance(first, torch.Tensor) or not first.is_floating_point():
        return extra
    saved = SavedTensors(exclude=target_tensors(target))
    with saved:  # the output itself counts where the loss saves it (it shares the output's storage)
        loss_fn(first.detach().requires_grad_(), target)
    extra += saved.total_bytes
    saved.release()
    return extra
