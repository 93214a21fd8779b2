"""Factories used by the `module:factory` tests (no tests here; imported by spec string)."""

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from planner.models import ModelBundle


def plain(hidden=8, seed=None):
    """A plain Sequential: its input comes from --input-shape."""
    return nn.Sequential(OrderedDict(fc0=nn.Linear(4, hidden), act=nn.ReLU(), fc1=nn.Linear(hidden, 2)))


def tokens(vocab=50):
    """Long input: embedding, flatten, linear."""
    return nn.Sequential(OrderedDict(embed=nn.Embedding(vocab, 4), flat=nn.Flatten(), head=nn.Linear(4 * 6, 3)))


def with_data():
    """A Sequential that brings its own batch maker and loss as attributes."""
    model = nn.Sequential(OrderedDict(fc=nn.Linear(3, 5), head=nn.Linear(5, 2)))

    def make_batch(batch_size, seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(batch_size, 3, generator=g), torch.randint(0, 2, (batch_size,), generator=g)

    model.make_batch = make_batch
    model.loss_fn = F.cross_entropy
    return model


def bundle(seed=0):
    """A full ModelBundle."""
    layers = nn.Sequential(OrderedDict(a=nn.Linear(2, 2), b=nn.Linear(2, 1)))

    def make_batch(batch_size, s):
        g = torch.Generator().manual_seed(s)
        return torch.randn(batch_size, 2, generator=g), torch.randn(batch_size, 1, generator=g)

    return ModelBundle("custom", layers, make_batch, F.mse_loss, 8)


def not_a_model():
    return 42


def empty():
    return nn.Sequential()


def broken():
    raise ValueError("factory exploded")


def tuple_output():
    """A layer returning a tuple: not a pipeline layer."""

    class Two(nn.Module):
        def forward(self, x):
            return x, x

    return nn.Sequential(OrderedDict(lin=nn.Linear(4, 4), two=Two()))


NOT_CALLABLE = 3


def fails_at_batch_two():
    """Runs at micro-batch size 1, fails at 2: a model error found only while profiling."""

    class Picky(nn.Module):
        def forward(self, x):
            if x.shape[0] >= 2:
                raise RuntimeError("boom at batch two")
            return x * 2

    model = nn.Sequential(OrderedDict(fc=nn.Linear(3, 3), picky=Picky()))
    model.make_batch = lambda batch_size, seed: (torch.randn(batch_size, 3), torch.randn(batch_size, 3))
    model.loss_fn = F.mse_loss
    return model


def out_of_cpu_memory_at_batch_two():
    """Fails at micro-batch size 2 as torch's CPU allocator does (a RuntimeError, not OutOfMemoryError)."""

    class Greedy(nn.Module):
        def forward(self, x):
            if x.shape[0] >= 2:
                raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate "
                                   "memory: you tried to allocate 28711218176 bytes. Error code 12 (Cannot allocate memory)")
            return x * 2

    model = nn.Sequential(OrderedDict(fc=nn.Linear(3, 3), greedy=Greedy()))
    model.make_batch = lambda batch_size, seed: (torch.randn(batch_size, 3), torch.randn(batch_size, 3))
    model.loss_fn = F.mse_loss
    return model


# Models of the kinds torchvision and users write (found by the issue 13 acceptance hunt); tests/test_byom_models.py.

class ShapesAcrossACut(nn.Module):
    """`b, c, h, w = x.shape` after one module, used by the next (`x.view(x.size(0), -1)` too):
    the ints are recomputed by the layer that reads them, never sent."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2))
        self.mid = nn.Conv2d(4, 4, 3, padding=1)
        self.classifier = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        x = self.features(x)
        b, c, h, w = x.shape
        x = self.mid(x).reshape(b, c, h * w).transpose(1, 2).reshape(b, h, w, c).permute(0, 3, 1, 2)
        return self.classifier(x.view(x.size(0), -1))


def shapes_across_a_cut():
    return ShapesAcrossACut()


class TwoHeads(nn.Module):
    """A dict output; `b`'s output is read by `cls` and passed on to `reg` (a skip value)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(8, 8)
        self.cls = nn.Linear(8, 3)
        self.reg = nn.Linear(8, 2)

    def forward(self, x):
        h = torch.relu(self.b(torch.relu(self.a(x))))
        return {"logits": self.cls(h), "box": self.reg(h)}


def two_heads(target="tuple"):
    """TwoHeads with its own data: a (class ids, boxes) tuple target, or a dict one."""
    model = TwoHeads()

    def make_batch(batch_size, seed):
        g = torch.Generator().manual_seed(seed)
        labels, boxes = torch.randint(0, 3, (batch_size,), generator=g), torch.randn(batch_size, 2, generator=g)
        return torch.randn(batch_size, 6, generator=g), ((labels, boxes) if target == "tuple" else {"labels": labels, "boxes": boxes})

    def loss_fn(out, t):
        labels, boxes = t if target == "tuple" else (t["labels"], t["boxes"])
        return F.cross_entropy(out["logits"], labels) + F.mse_loss(out["box"], boxes)

    model.make_batch, model.loss_fn = make_batch, loss_fn
    return model


def two_heads_plain():
    """TwoHeads without data: `--input-shape 6`, one noise target per output."""
    return TwoHeads()


class Encoder(nn.Module):
    """Token embedding, learned positions, an nn.TransformerEncoder (batch_first), a classifier."""

    def __init__(self, vocab=32, dim=16, depth=3, seq=8, classes=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, seq, dim) * 0.02)
        block = nn.TransformerEncoderLayer(dim, 2, 2 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(block, depth, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x) + self.pos).mean(1))


def encoder(own_data=False):
    """`--input-shape 8 --input-dtype long --vocab 32`; with own_data, tokens and class ids of its own."""
    model = Encoder()
    if own_data:
        def make_batch(batch_size, seed):
            g = torch.Generator().manual_seed(seed)
            return torch.randint(0, 32, (batch_size, 8), generator=g), torch.randint(0, 4, (batch_size,), generator=g)

        model.make_batch, model.loss_fn = make_batch, F.cross_entropy
    return model


def int_output():
    """A model returning a tensor and an int: refused in one line."""

    class WithInt(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x), 3

    return WithInt()


class _Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x, mask):
        y = self.ln(x)
        x = x + self.attn(y, y, y, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(x)


class NanoGPT(nn.Module):
    """nanoGPT's forward: positions and a causal mask made from `idx.size()` (torch.arange,
    torch.ones, torch.triu on ints), the mask passed to every block."""

    def __init__(self, vocab=32, d=16, n=3, seq=8):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList([_Block(d) for _ in range(n)])
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=idx.device), diagonal=1)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(x)


def nanogpt():
    """Next-token prediction on its own random tokens."""
    model = NanoGPT()

    def make_batch(batch_size, seed):
        ids = torch.randint(0, 32, (batch_size, 9), generator=torch.Generator().manual_seed(seed))
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    model.make_batch = make_batch
    model.loss_fn = lambda logits, y: F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    return model


class WithDefaults(nn.Module):
    """`forward(self, x, mask=None, return_features=False)`: called with x alone."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 2)

    def forward(self, x, mask=None, return_features: bool = False):
        h = torch.relu(self.a(x))
        if mask is not None:
            h = h * mask
        out = self.b(h)
        return (out, h) if return_features else out


def with_defaults():
    return WithDefaults()
