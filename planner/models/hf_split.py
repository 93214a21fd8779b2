"""Cutting a transformers language model into pipeline layers by watching its own forward.

No per-family table: one forward of the model on a small probe, with hooks, tells
  - the blocks: the nn.ModuleList whose members the forward calls most often (ties: the
    shallowest; ALBERT calls its one shared layer group once per layer, so a layer is a call,
    and two layers may hold the same module);
  - the prologue: the modules beside the path from the model to that list called before the
    first block (embeddings, position embeddings, GPT-2's and OPT's projections, ALBERT's
    embedding mapping, rotary tables);
  - the epilogue: those called after the last block (final norm, OPT's project_out) and the
    task model's own (LM head, MLM head).
The layers then run the model's own code, so whatever a family does between its parts
(Gemma's embedding scale, Gemma 2's logit soft-capping, Bloom's ALiBi, sliding-window masks)
happens exactly as in the model:
  embed   the model's forward on the input, stopped where the first block is called;
  block i the block of the i-th call with the arguments the model gives it, but for the
          hidden states: positions, rotary tables, masks are recorded once per input shape by
          running the model's forward with every block replaced by a recorder (no block runs);
  head    the model's forward with the path's modules replaced by the epilogue applied to the
          received hidden states: the task model's own head code (soft-capping included) runs.
Only hidden states cross a cut. A family that passes anything else computed from weights
into its blocks (DeBERTa's relative embeddings), or that computes between blocks, is refused
when built: `check_split` compares the split with the model's own logits and loss.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from planner.errors import ModelSpecError

__all__ = ["Split", "find_split", "check_split", "observe_once"]


class _Stop(Exception):
    """Raised by a hook to end the model's forward early, carrying what the hook saw."""

    def __init__(self, value: Any = None):
        super().__init__("pplan stop")
        self.value = value


class _Out:
    """What the stubbed base model returns to the task model: its hidden states, and None for
    any other field the task model reads (past_key_values, attentions, ...)."""

    def __init__(self, x: torch.Tensor):
        self.last_hidden_state = x
        # image classifiers read this: their epilogue's last module is the pooler, whose (B, C, 1, 1)
        # output a CNN's base model flattens (a Flatten in the classifier is then a no-op)
        flat = x.dim() == 4 and tuple(x.shape[-2:]) == (1, 1)
        self.pooler_output = x.flatten(1) if flat else x

    def __getitem__(self, i: Any) -> Any:
        return (self.last_hidden_state, self.pooler_output)[i]  # as BaseModelOutputWithPooling (Hiera reads [1])

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return None


def _hidden(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _first(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return out[0]
    hidden = getattr(out, "last_hidden_state", None)
    return hidden if hidden is not None else out[0]


class Split:
    """The parts of one transformers model (module docstring) and the calls that run them."""

    def __init__(self, root: nn.Module, path: list[nn.Module], blocks: nn.ModuleList, calls: list[nn.Module],
                 before: list[nn.Module], base_tail: list[nn.Module], task_tail: list[nn.Module], out_len: int,
                 input_key: str, probe: Callable[[torch.Tensor], torch.Tensor]):
        self.root, self.path, self.blocks, self.calls = root, path, blocks, calls
        self.before, self.base_tail, self.task_tail = before, base_tail, task_tail
        self.out_len = out_len  # 0: a block returns a tensor; n: a tuple of n
        self.input_key, self.probe = input_key, probe  # probe(h): a model input giving hidden states shaped like h
        self._inputs: dict[tuple, list[tuple[tuple, dict, bool]]] = {}

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The model's forward on `x` up to its first block: that block's hidden-state input."""

        def stop(_m: nn.Module, args: tuple, kwargs: dict) -> None:
            raise _Stop(_hidden(args, kwargs))

        handles = [m.register_forward_pre_hook(stop, with_kwargs=True) for m in set(self.calls)]
        try:
            self.root(**{self.input_key: x})
        except _Stop as s:
            return s.value
        finally:
            for h in handles:
                h.remove()
        raise ModelSpecError(f"{type(self.root).__name__} did not call its blocks")

    def block_inputs(self, i: int, h: torch.Tensor) -> tuple[tuple, dict, bool]:
        """(other positional args, keyword args, hidden states by keyword?) of call i for
        hidden states shaped like `h`, recorded once per shape, on h's device and dtype."""
        key = (tuple(h.shape[:-1]), h.device, h.dtype)
        if key not in self._inputs:
            recorded = self.record(self.probe(h), grad=False)
            self._inputs[key] = [(*tree_map(lambda v: _like(v, h), (a, k)), by_kw) for a, k, by_kw in recorded]
        return self._inputs[key][i]

    def record(self, probe: torch.Tensor, grad: bool) -> list[tuple[tuple, dict, bool]]:
        """Run the model's forward on `probe` with every block replaced by a recorder (no block
        runs): the arguments of each call, the hidden states left out."""
        calls: list[tuple[tuple, dict, bool]] = []
        n = len(self.calls)

        def recorder(*args: Any, **kwargs: Any) -> Any:
            by_kw = not args
            h = kwargs.pop("hidden_states") if by_kw else args[0]
            calls.append((tuple(args[1:]), kwargs, by_kw))
            if len(calls) == n:
                raise _Stop()
            return (h,) + (None,) * (self.out_len - 1) if self.out_len else h

        # on the prologue's device (a rank that holds the embedding may have moved it)
        device = next((p.device for m in self.before for p in m.parameters()), torch.device("cpu"))
        probe = probe.to(device)
        members = list(set(self.calls))
        saved = _replace_forward(members, recorder)
        # in eval mode, random state kept: the probe must not move BatchNorm statistics or draw
        # dropout masks (a rank records once per shape, one process too: counts would differ)
        modes = [(m, m.training) for m in self.root.modules()]
        try:
            self.root.eval()
            with torch.set_grad_enabled(grad), torch.random.fork_rng(devices=[]):
                self.root(**{self.input_key: probe})
        except _Stop:
            pass
        finally:
            _restore_forward(saved)
            for m, training in modes:
                m.training = training
        if len(calls) != n:
            raise ModelSpecError(f"{type(self.root).__name__} called its blocks {len(calls)} times on a probe, {n} before")
        return calls

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """The task model's forward with the base model replaced by the epilogue applied to `h`."""

        def base(*_a: Any, **_k: Any) -> _Out:
            x = h
            for m in self.base_tail:
                x = _first(m(x))
            return _Out(x)

        saved = _replace_forward(self.path[1:], base)
        try:
            out = self.root(**self._head_kwargs())
        finally:
            _restore_forward(saved)
        logits = getattr(out, "logits", None)
        return logits if logits is not None else out[0]

    def _head_kwargs(self) -> dict[str, Any]:
        """The input as None when the task model's forward requires it (Hiera's takes
        pixel_values positionally and hands it to the stubbed base model, which ignores it)."""
        try:
            param = inspect.signature(self.root.forward).parameters.get(self.input_key)
        except (TypeError, ValueError):
            return {}
        return {self.input_key: None} if param is not None and param.default is inspect.Parameter.empty else {}


def _replace_forward(mods: list[nn.Module], fn: Callable[..., Any]) -> list[tuple[nn.Module, Any]]:
    """Make `fn` each module's forward for a while: an instance attribute, which nn.Module.__call__
    runs instead of the class's. Returns what to restore (an instance forward some library set)."""
    saved = [(m, m.__dict__.get("forward")) for m in mods]
    for m in mods:
        m.forward = fn
    return saved


def _restore_forward(saved: list[tuple[nn.Module, Any]]) -> None:
    for m, before in saved:
        if before is None:
            del m.forward
        else:
            m.forward = before


def _like(v: Any, h: torch.Tensor) -> Any:
    if not isinstance(v, torch.Tensor):
        return v
    v = v.detach()
    return v.to(device=h.device, dtype=h.dtype) if v.is_floating_point() else v.to(h.device)


def _depth(name: str) -> int:
    return name.count(".")


def _nested(root: nn.Module, name: str, called: set[int]) -> bool:
    """Whether the module `name` lies inside a called member of another ModuleList."""
    parts = name.split(".")
    for k in range(1, len(parts)):
        parent = root.get_submodule(".".join(parts[:k - 1]))
        if isinstance(parent, nn.ModuleList) and id(root.get_submodule(".".join(parts[:k]))) in called:
            return True
    return False


def find_split(root: nn.Module, example: torch.Tensor, input_key: str, probe: Callable[[torch.Tensor], torch.Tensor],
               spec: str) -> Split:
    """Watch one forward of `root` on `example` (eval mode, no gradients) and return its Split;
    `probe(h)` makes a model input whose hidden states are shaped like h (Split.block_inputs)."""
    names = {id(m): n for n, m in root.named_modules(remove_duplicate=False)}
    order, outs = _watch(root, example, input_key)
    list_name, blocks = _block_list(root, order, spec)
    members = {id(c): c for c in blocks}
    calls = [members[i] for i in order if i in members]
    path = _path_to(root, list_name, names, spec)
    before, base_tail, task_tail = _beside_path(root, path, blocks, list_name, order, names, spec)
    out = outs.get(id(calls[0]))
    out_len = len(out) if isinstance(out, tuple) else 0
    return Split(root, path, blocks, calls, before, base_tail, task_tail, out_len, input_key, probe)


def _watch(root: nn.Module, example: torch.Tensor, input_key: str) -> tuple[list[int], dict[int, Any]]:
    """One forward of `root` in eval mode without gradients: the ids of the submodules in the
    order they are called (a module called twice appears twice), and each one's first output."""
    order: list[int] = []
    outs: dict[int, Any] = {}

    def pre(m: nn.Module, _args: tuple) -> None:
        order.append(id(m))

    def post(m: nn.Module, _args: tuple, out: Any) -> None:
        outs.setdefault(id(m), out)

    mods = [m for m in root.modules() if m is not root]
    observe_once(root, [m.register_forward_pre_hook(pre) for m in mods] + [m.register_forward_hook(post) for m in mods],
                 {input_key: example})
    return order, outs


def observe_once(root: nn.Module, handles: list[Any], inputs: dict[str, Any], keep_rng: bool = False) -> None:
    """One forward of `root(**inputs)` for the hooks behind `handles` to watch: in eval mode (no
    BatchNorm statistics moved) without gradients, then the hooks removed and every module's
    training flag put back; `keep_rng`: the random state is left as it was."""
    modes = [(m, m.training) for m in root.modules()]
    try:
        root.eval()
        with torch.no_grad(), (torch.random.fork_rng(devices=[]) if keep_rng else contextlib.nullcontext()):
            root(**inputs)
    finally:
        for h in handles:
            h.remove()
        for m, training in modes:
            m.training = training


def _block_list(root: nn.Module, order: list[int], spec: str) -> tuple[str, nn.ModuleList]:
    """The name and module of the model's list of blocks: the ModuleList whose members were
    called most often in `order` (ties: the shallowest)."""
    called = set(order)
    # a list inside a block (MobileBERT's feed-forward stack, ALBERT's layers in a group) is not
    # the model's list of blocks, however often it is called
    lists = [(n, m) for n, m in root.named_modules() if isinstance(m, nn.ModuleList) and len(m) and not _nested(root, n, called)]
    counts = [(sum(1 for i in order if i in ids), -_depth(n), n, lst) for n, lst in lists for ids in [{id(c) for c in lst}]]
    counts = [c for c in counts if c[0] > 0]
    if not counts:
        raise ModelSpecError(f"model {spec!r}: pplan finds no list of blocks that {type(root).__name__} calls",
                             "hf: splits models whose layers are an nn.ModuleList; see docs/models.md")
    _, _, list_name, blocks = max(counts, key=lambda c: (c[0], c[1]))
    return list_name, blocks


def _path_to(root: nn.Module, list_name: str, names: dict[int, str], spec: str) -> list[nn.Module]:
    """The modules from `root` down to the block list's parent; refused when one of them holds
    a weight directly (no pipeline layer would hold it)."""
    parts = list_name.split(".")
    path = [root] + [root.get_submodule(".".join(parts[:k])) for k in range(1, len(parts))]
    loose = [names.get(id(m), type(m).__name__) or type(root).__name__ for m in path if any(True for _ in m.parameters(recurse=False))]
    if loose:
        raise ModelSpecError(f"model {spec!r}: {loose[0]} holds weights outside its submodules, which no pipeline layer "
                             "would hold", "not supported; see docs/models.md")
    return path


def _beside_path(root: nn.Module, path: list[nn.Module], blocks: nn.ModuleList, list_name: str, order: list[int],
                 names: dict[int, str], spec: str) -> tuple[list[nn.Module], list[nn.Module], list[nn.Module]]:
    """The children of the path's modules besides the path, as (prologue, base model's
    epilogue, task model's epilogue), the epilogues in call order; refused when one is called
    between the first and the last block."""
    block_ids = {id(c) for c in blocks}
    steps = [k for k, i in enumerate(order) if i in block_ids]
    first, last = steps[0], steps[-1]
    before, base_tail, task_tail = [], [], []
    for depth, owner in enumerate(path):
        for child in owner.children():
            if child is blocks or (depth + 1 < len(path) and child is path[depth + 1]):
                continue
            inside = {id(m) for m in child.modules()}  # a ModuleList is never called, its members are
            when = [k for k, i in enumerate(order) if i in inside]
            if not when:
                continue  # not used by this task (BERT's pooler under the MLM head)
            if any(first < k < last for k in when):
                raise ModelSpecError(f"model {spec!r}: {type(root).__name__} calls {names[id(child)]} between its blocks "
                                     f"({list_name}), "
                                     "which pplan cannot cut around", "not supported; see docs/models.md")
            if when[0] < first:
                before.append(child)
            if when[-1] > last:
                (task_tail if depth == 0 else base_tail).append((when[0] if when[0] > last else when[-1], child))
    return before, [m for _, m in sorted(base_tail, key=lambda p: p[0])], [m for _, m in sorted(task_tail, key=lambda p: p[0])]


def check_split(model: nn.Module, split: Split | None, layers: nn.Sequential, input_key: str, x: torch.Tensor,
                y: torch.Tensor, loss_fn: Callable[[Any, Any], Any], spec: str) -> None:
    """Refuse (one line) a cut whose forward or loss differs from the model's own, or whose
    blocks take a value computed from weights (it would have to cross a cut with its gradient)."""
    try:
        _check(model, split, layers, input_key, x, y, loss_fn, spec)
    except ModelSpecError:
        raise
    except Exception as e:  # noqa: BLE001 - the model's own code failed on the cut: one line
        raise ModelSpecError(f"model {spec!r}: cut into layers, {type(model).__name__} fails: {type(e).__name__}: "
                             f"{' '.join(str(e).split())[:200]}", "not supported; see docs/models.md for the families that are") from None


def _check(model: nn.Module, split: Split | None, layers: nn.Sequential, input_key: str, x: torch.Tensor,
           y: torch.Tensor, loss_fn: Callable[[Any, Any], Any], spec: str) -> None:
    for i, (args, kwargs, _) in enumerate(split.record(x, grad=True) if split is not None else []):
        leaves = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.requires_grad]
        if leaves:
            raise ModelSpecError(f"model {spec!r}: {type(model).__name__} passes its blocks a tensor computed from weights "
                                 f"(block {i}, shape {tuple(leaves[0].shape)}), besides the hidden states; pplan sends only "
                                 "hidden states between stages", "not supported; see docs/models.md for the families that are")
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        with torch.no_grad():
            ours = layers(x)
            theirs = model(**{input_key: x, "labels": y})
            ours_loss = loss_fn(ours, y)
    finally:
        for m, training in modes:
            m.training = training
        if split is not None:
            split._inputs.clear()  # recorded in eval mode on the probe's shape: not kept
    logits = theirs.logits
    if ours.shape != logits.shape or not torch.allclose(ours, logits, rtol=1e-4, atol=1e-4):
        diff = (ours - logits).abs().max().item() if ours.shape == logits.shape else f"shape {tuple(ours.shape)} vs {tuple(logits.shape)}"
        raise ModelSpecError(f"model {spec!r}: cut into layers, {type(model).__name__} does not give its own logits "
                             f"(max difference {diff}): its forward does something pplan's cut does not see",
                             "not supported; see docs/models.md for the families that are")
    if theirs.loss is not None and not torch.allclose(ours_loss, theirs.loss.float(), rtol=1e-4, atol=1e-5):
        raise ModelSpecError(f"model {spec!r}: the loss pplan computes ({ours_loss.item():.6g}) differs from "
                             f"{type(model).__name__}'s own ({theirs.loss.item():.6g})", "not supported; see docs/models.md")
