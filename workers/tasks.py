"""Tasks of SPEC §5, generated locally: ``make_task(name, size="smoke"|"paper", seed, **params)``.

Every batch is a pure function of ``(seed, split, index)``, so a run is reproducible and a resumed
run continues the same data stream without saved RNG state. Train and validation never overlap:
continuous tasks draw from separate streams; discrete tasks either split a fixed example set
(``modadd``) or keep an example in exactly one split by a hash of its tokens. ``memorize`` is
measured on its training set by definition (paper 002).

Each task declares its inputs (``tokens`` with ``vocab_size``, or ``vectors`` with
``input_dim``/``output_dim``), ``seq_len``, a metric and its direction; ``fit_arch`` wires an
``ArchConfig``'s input/output to the task.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from search_spaces import ArchConfig, ModelIO
from search_spaces.kernels import parse_kernel

SPLITS = {"train": 0, "val": 1}
VAL_BUCKETS = 10  # a hashed discrete example is in val iff hash % VAL_BUCKETS == 0


class TaskError(ValueError):
    """Unknown task, size or parameter; the message lists the valid ones."""


@dataclass(frozen=True)
class Batch:
    """``x``: (B, T) ids or (B, T, in); ``y``: (B, T) ids or (B, T, out); ``mask``: (B, T) bool
    positions that count; ``aux``: per-token side information (e.g. cluster labels)."""

    x: Tensor
    y: Tensor
    mask: Tensor
    aux: Tensor | None = None

    def to(self, device: str | torch.device) -> Batch:
        aux = None if self.aux is None else self.aux.to(device)
        return Batch(self.x.to(device), self.y.to(device), self.mask.to(device), aux)


def generator(seed: int, split: str, index: int) -> torch.Generator:
    """The RNG of batch ``index`` of ``split``: distinct, reproducible streams."""
    return torch.Generator().manual_seed(((seed * 1_000_003 + SPLITS[split]) * 1_000_033
                                          + index) % (2**63 - 1))


def row_hash(x: Tensor) -> Tensor:
    """Stable hash of each row of an integer tensor (B, T) -> (B,)."""
    h = torch.zeros(x.shape[0], dtype=torch.int64)
    for column in x.long().unbind(1):
        h = (h * 131 + column + 1) % 2_147_483_647
    return h


def in_split(x: Tensor, split: str) -> Tensor:
    """(B,) bool: which example rows belong to ``split`` (by hash bucket)."""
    val = row_hash(x) % VAL_BUCKETS == 0
    return val if split == "val" else ~val


@dataclass(frozen=True)
class Task:
    """Base: subclasses set the class variables and implement ``make``."""

    name: ClassVar[str]
    inputs: ClassVar[str]  # "tokens" or "vectors"
    metric: ClassVar[str]
    higher_is_better: ClassVar[bool]
    sizes: ClassVar[dict[str, dict[str, Any]]]
    seed: int = 0

    @property
    def seq_len(self) -> int:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int | None:
        return None

    @property
    def input_dim(self) -> int | None:
        return None

    @property
    def output_dim(self) -> int | None:
        return self.input_dim

    @property
    def io(self) -> ModelIO:
        """The sequence length and input/output maps this task gives a model."""
        if self.inputs == "tokens":
            return ModelIO(self.seq_len, vocab_size=self.vocab_size)
        return ModelIO(self.seq_len, input_dim=self.input_dim, output_dim=self.output_dim)

    def make(self, g: torch.Generator, size: int, split: str) -> Batch:
        raise NotImplementedError

    def batch(self, split: str, index: int, size: int) -> Batch:
        return self.make(generator(self.seed, split, index), size, split)

    def loss(self, out: Tensor, b: Batch) -> Tensor:
        """Cross-entropy on masked positions (tokens) or their mean squared error (vectors)."""
        if self.inputs == "tokens":
            return F.cross_entropy(out[b.mask].float(), b.y[b.mask])
        return (out[b.mask].float() - b.y[b.mask]).pow(2).mean()

    def score(self, out: Tensor, b: Batch) -> tuple[float, int]:
        """(sum, count) of the metric over the batch, to average across batches."""
        if self.inputs == "tokens":
            right = (out.argmax(-1) == b.y) & b.mask
            return float(right.sum()), int(b.mask.sum())
        err = (out.float() - b.y).pow(2).mean(-1)[b.mask]
        return float(err.sum()), int(err.numel())

    def extra(self, metric: float, trainable_params: int) -> dict[str, float]:
        """Task-specific numbers derived at the end (e.g. bits per parameter)."""
        return {}


# --- regression on vectors ----------------------------------------------------------------------


@dataclass(frozen=True)
class KernelTask(Task):
    """``x_t ~ N(0, I)``, ``y_t = sum_s rho(s) x_{t-s} + noise`` (zero padding), MSE."""

    name: ClassVar[str] = "kernel"
    inputs: ClassVar[str] = "vectors"
    metric: ClassVar[str] = "mse"
    higher_is_better: ClassVar[bool] = False
    sizes: ClassVar[dict[str, dict[str, Any]]] = {
        "smoke": {"dim": 8, "length": 16}, "paper": {"dim": 64, "length": 64}}
    dim: int = 8
    length: int = 16
    kernel: str = "exp:0.5"
    noise: float = 0.1

    @property
    def seq_len(self) -> int:
        return self.length

    @property
    def input_dim(self) -> int:
        return self.dim

    def rho(self) -> Tensor:
        return torch.tensor(parse_kernel(self.kernel, self.length), dtype=torch.float32)

    @functools.cached_property
    def mixing(self) -> Tensor:
        """(T, T) lower-triangular Toeplitz: ``mix[t, s] = rho(t - s)`` for ``s < t``."""
        t, rho = self.length, self.rho()
        lag = torch.arange(t)[:, None] - torch.arange(t)[None, :]
        return torch.where(lag >= 1, rho[(lag - 1).clamp(0, t - 1)], torch.zeros(()))

    def make(self, g: torch.Generator, size: int, split: str) -> Batch:
        x = torch.randn(size, self.length, self.dim, generator=g)
        t = self.length
        y = self.mixing @ x + self.noise * torch.randn(size, t, self.dim, generator=g)
        return Batch(x, y, torch.ones(size, t, dtype=torch.bool))


@dataclass(frozen=True)
class NgramTask(KernelTask):
    """Paper 003 §6.1: the sum of the previous four tokens plus noise."""

    name: ClassVar[str] = "ngram"
    kernel: str = "ngram:4"


@dataclass(frozen=True)
class DenoiseTask(Task):
    """Paper 000 Def. 2.1: tokens from K noisy orthogonal subspaces; predict the clean signal.

    Metric: SNR of the output, ``||P_k y|| / ||(I - P_k) y||`` w.r.t. each token's subspace.
    """

    name: ClassVar[str] = "denoise"
    inputs: ClassVar[str] = "vectors"
    metric: ClassVar[str] = "snr"
    higher_is_better: ClassVar[bool] = True
    sizes: ClassVar[dict[str, dict[str, Any]]] = {
        "smoke": {"clusters": 3, "rank": 4, "length": 12},
        "paper": {"clusters": 4, "rank": 32, "length": 128}}
    clusters: int = 3
    rank: int = 4
    length: int = 12
    delta: float = 0.2

    @property
    def seq_len(self) -> int:
        return self.length

    @property
    def input_dim(self) -> int:
        return self.clusters * self.rank

    def bases(self) -> Tensor:
        """(K, d, p) orthonormal bases, fixed by the task seed."""
        return self._bases

    @functools.cached_property
    def _bases(self) -> Tensor:
        d = self.input_dim
        q, _ = torch.linalg.qr(torch.randn(d, d, generator=generator(self.seed, "train", -1)))
        return q.T.reshape(self.clusters, self.rank, d).transpose(1, 2).contiguous()

    def make(self, g: torch.Generator, size: int, split: str) -> Batch:
        u = self.bases()
        labels = torch.randint(0, self.clusters, (size, self.length), generator=g)
        coef = torch.randn(size, self.length, self.clusters, self.rank, generator=g)
        own = F.one_hot(labels, self.clusters).bool()  # (B, T, K)
        scale = torch.where(own, 1.0, self.delta)[..., None]
        parts = torch.einsum("btkp,kdp->btkd", coef * scale, u)
        signal = (parts * own[..., None]).sum(2)
        return Batch(parts.sum(2), signal, torch.ones(size, self.length, dtype=torch.bool),
                     labels)

    def score(self, out: Tensor, b: Batch) -> tuple[float, int]:
        assert b.aux is not None
        u = self.bases().to(out.device)[b.aux]  # (B, T, d, p)
        inside = torch.einsum("btdp,btp->btd", u, torch.einsum("btdp,btd->btp", u, out.float()))
        ratio = inside.norm(dim=-1) / (out.float() - inside).norm(dim=-1).clamp_min(1e-12)
        return float(ratio[b.mask].sum()), int(b.mask.sum())


@dataclass(frozen=True)
class ICLLinearTask(Task):
    """In-context linear regression (paper 000 §4.2.2): tokens ``x_1, y_1, x_2, y_2, ...``;
    predict ``y_i`` at ``x_i``. ``sparsity > 0`` keeps that many non-zeros in ``w``.
    Metric: MSE / d (normalised, Garg et al.)."""

    name: ClassVar[str] = "icl_linear"
    inputs: ClassVar[str] = "vectors"
    metric: ClassVar[str] = "nmse"
    higher_is_better: ClassVar[bool] = False
    sizes: ClassVar[dict[str, dict[str, Any]]] = {
        "smoke": {"dim": 5, "points": 10}, "paper": {"dim": 20, "points": 40}}
    dim: int = 5
    points: int = 10
    sparsity: int = 0

    @property
    def seq_len(self) -> int:
        return 2 * self.points

    @property
    def input_dim(self) -> int:
        return self.dim + 1  # x in the first d coordinates, y in the last

    @property
    def output_dim(self) -> int:
        return 1

    def make(self, g: torch.Generator, size: int, split: str) -> Batch:
        d, n = self.dim, self.points
        w = torch.randn(size, d, generator=g)
        if self.sparsity:
            keep = torch.rand(size, d, generator=g).argsort(-1) < self.sparsity
            w = w * keep
        xs = torch.randn(size, n, d, generator=g)
        ys = torch.einsum("bnd,bd->bn", xs, w)
        seq = torch.zeros(size, 2 * n, d + 1)
        seq[:, 0::2, :d] = xs
        seq[:, 1::2, d] = ys
        target = torch.zeros(size, 2 * n, 1)
        target[:, 0::2, 0] = ys
        mask = torch.zeros(size, 2 * n, dtype=torch.bool)
        mask[:, 0::2] = True
        return Batch(seq, target, mask)

    def score(self, out: Tensor, b: Batch) -> tuple[float, int]:
        err = (out.float() - b.y).pow(2).squeeze(-1)[b.mask] / self.dim
        return float(err.sum()), int(err.numel())


# --- token tasks --------------------------------------------------------------------------------


def _take_split(make_rows: Any, g: torch.Generator, size: int, split: str) -> Tensor:
    """Rows from ``make_rows(g, n)`` that hash into ``split``, until ``size`` are found."""
    found: list[Tensor] = []
    have = 0
    while have < size:
        rows = make_rows(g, 2 * size + 8)
        keep = rows[in_split(rows, split)]
        found.append(keep)
        have += len(keep)
    return torch.cat(found)[:size]


def _last_position(seq: Tensor, answer: Tensor) -> Batch:
    """Predict ``answer`` (B,) at the last position of ``seq`` (B, T)."""
    y = torch.zeros_like(seq)
    y[:, -1] = answer
    mask = torch.zeros_like(seq, dtype=torch.bool)
    mask[:, -1] = True
    return Batch(seq, y, mask)


@dataclass(frozen=True)
class InductionTask(Task):
    """A random pattern repeated twice (paper 003 App. E.1); next-token accuracy on the repeat."""

    name: ClassVar[str] = "induction"
    inputs: ClassVar[str] = "tokens"
    metric: ClassVar[str] = "acc"
    higher_is_better: ClassVar[bool] = True
    sizes: ClassVar[dict[str, dict[str, Any]]] = {
        "smoke": {"vocab": 16, "length": 16}, "paper": {"vocab": 64, "length": 128}}
    vocab: int = 16
    length: int = 16

    @property
    def seq_len(self) -> int:
        return self.length

    @property
    def vocab_size(self) -> int:
        return self.vocab

    def make(self, g: torch.Generator, size: int, split: str) -> Batch:
        half = self.length // 2

        def rows(gen: torch.Generator, n: int) -> Tensor:
            return torch.randint(0, self.vocab, (n, half), generator=gen)

        pattern = _take_split(rows, g, size, split)
        seq = torch.cat([pattern, pattern, pattern[:, : self.length - 2 * half]], dim=1)
        y = torch.zeros_like(seq)
        y[:, :-1] = seq[:, 1:]
        mask = torch.zeros_like(seq, dtype=torch.bool)
        mask[:, half : self.length - 1] = True  # tokens predictable by copying the first half
        return Batch(seq, y, mask)


@dataclass(frozen=True)
class RetrievalTask(Task):
    """Needle in a haystack (paper 002): ``m ~ U{1..m_max}`` key/value pairs, then a query key;
    answer its value. Keys in ``[V/2, V)`` (distinct within a sequence), values in ``[1, V/2)``,
    0 pads on the left."""

    name: ClassVar[str] = "retrieval"
    inputs: ClassVar[str] = "tokens"
    metric: ClassVar[str] = "acc"
    higher_is_better: ClassVar[bool] = True
    sizes: ClassVar[dict[str, dict[str, Any]]] = {
        "smoke": {"m_max": 4}, "paper": {"m_max": 20}}
    m_max: int = 4
    vocab: int = 256

    @property
    def seq_len(self) -> int:
        return 2 * self.m_max + 1

    @property
    def vocab_size(self) -> int:
        return self.vocab

    def _rows(self, g: torch.Generator, n: int) -> Tensor:
        half, m_max = self.vocab // 2, self.m_max
        keys = torch.rand(n, half, generator=g).argsort(-1)[:, :m_max] + half
        values = torch.randint(1, half, (n, m_max), generator=g)
        m = torch.randint(1, m_max + 1, (n, 1), generator=g)
        active = torch.arange(m_max)[None, :] >= m_max - m  # the last m pairs are used
        pairs = torch.stack([keys * active, values * active], dim=-1).reshape(n, 2 * m_max)
        pick = m_max - 1 - (torch.rand(n, 1, generator=g) * m).long()  # an active pair
        query = keys.gather(1, pick)
        return torch.cat([pairs, query], dim=1)

    def make(self, g: torch.Generator, size: int, split: str) -> Batch:
        seq = _take_split(self._rows, g, size, split)
        return _last_position(seq, self.answer(seq))

    def answer(self, seq: Tensor) -> Tensor:
        """The value that follows the query key in the prefix."""
        keys, values = seq[:, 0:-1:2], seq[:, 1:-1:2]
        hit = keys == seq[:, -1:]
        return (values * hit).sum(1)


@dataclass(frozen=True)
class ModAddTask(Task):
    """``(a + b) mod p`` (paper 002, p = 599): a fixed random split of all pairs."""

    name: ClassVar[str] = "modadd"
    inputs: ClassVar[str] = "tokens"
    metric: ClassVar[str] = "acc"
    higher_is_better: ClassVar[bool] = True
    sizes: ClassVar[dict[str, dict[str, Any]]] = {
        "smoke": {"p": 13, "train": 120, "val": 40},
        "paper": {"p": 599, "train": 40_000, "val": 4_000}}
    p: int = 13
    train: int = 120
    val: int = 40

    def __post_init__(self) -> None:
        if self.p < 2 or self.train < 1 or self.val < 1 or self.train + self.val > self.p**2:
            raise TaskError(f"modadd: train {self.train} + val {self.val} must be positive and "
                            f"fit in the p^2 = {self.p**2} pairs (p = {self.p}); set train "
                            "and val with --task-param")

    @property
    def seq_len(self) -> int:
        return 3

    @property
    def vocab_size(self) -> int:
        return self.p + 1  # numbers and "="

    @functools.cached_property
    def _order(self) -> Tensor:
        """A fixed random order of all p^2 pairs (train first, then validation)."""
        return torch.randperm(self.p**2, generator=generator(self.seed, "train", -1))

    def pairs(self, split: str) -> Tensor:
        order = self._order
        chosen = order[: self.train] if split == "train" else order[self.train:
                                                                    self.train + self.val]
        return torch.stack([chosen // self.p, chosen % self.p], dim=1)

    def make(self, g: torch.Generator, size: int, split: str) -> Batch:
        pool = self.pairs(split)
        ab = pool[torch.randint(0, len(pool), (size,), generator=g)]
        seq = torch.cat([ab, torch.full((size, 1), self.p)], dim=1)
        return _last_position(seq, ab.sum(1) % self.p)


@dataclass(frozen=True)
class AdditionTask(Task):
    """``a + b = c`` with n-digit numbers (paper 002: ten digits); exact match of all digits of
    ``c`` (teacher-forced argmax right everywhere = greedy decoding right)."""

    name: ClassVar[str] = "addition"
    inputs: ClassVar[str] = "tokens"
    metric: ClassVar[str] = "exact_match"
    higher_is_better: ClassVar[bool] = True
    sizes: ClassVar[dict[str, dict[str, Any]]] = {"smoke": {"digits": 3}, "paper": {"digits": 10}}
    digits: int = 3
    PLUS: ClassVar[int] = 10
    EQUALS: ClassVar[int] = 11

    @property
    def seq_len(self) -> int:
        return 3 * self.digits + 2

    @property
    def vocab_size(self) -> int:
        return 12

    def _rows(self, g: torch.Generator, n: int) -> Tensor:
        first = torch.randint(1, 10, (n, 2, 1), generator=g)
        rest = torch.randint(0, 10, (n, 2, self.digits - 1), generator=g)
        return torch.cat([first, rest], dim=2).reshape(n, 2 * self.digits)

    @staticmethod
    def value(digits: Tensor) -> Tensor:
        powers = 10 ** torch.arange(digits.shape[1] - 1, -1, -1)
        return (digits * powers).sum(1)

    def make(self, g: torch.Generator, size: int, split: str) -> Batch:
        n = self.digits
        ab = _take_split(self._rows, g, size, split)
        total = self.value(ab[:, :n]) + self.value(ab[:, n:])
        c = torch.stack([(total // 10**i) % 10 for i in range(n, -1, -1)], dim=1)
        plus, equals = torch.full((size, 1), self.PLUS), torch.full((size, 1), self.EQUALS)
        full = torch.cat([ab[:, :n], plus, ab[:, n:], equals, c], dim=1)  # (B, 3n + 3)
        mask = torch.zeros(size, 3 * n + 2, dtype=torch.bool)
        mask[:, 2 * n + 1 :] = True  # positions whose next token is a digit of c
        return Batch(full[:, :-1], full[:, 1:], mask)

    def score(self, out: Tensor, b: Batch) -> tuple[float, int]:
        right = (out.argmax(-1) == b.y) | ~b.mask
        return float(right.all(1).sum()), int(b.x.shape[0])


@dataclass(frozen=True)
class DyckTask(Task):
    """Is a parenthesis sequence balanced (Dyck-1, paper 002, length 40)? Half the candidates
    are random balanced words, the rest shuffles or random strings; labels by a checker."""

    name: ClassVar[str] = "dyck"
    inputs: ClassVar[str] = "tokens"
    metric: ClassVar[str] = "acc"
    higher_is_better: ClassVar[bool] = True
    sizes: ClassVar[dict[str, dict[str, Any]]] = {"smoke": {"length": 12}, "paper": {"length": 40}}
    length: int = 12
    OPEN: ClassVar[int] = 0
    CLOSE: ClassVar[int] = 1
    QUERY: ClassVar[int] = 2
    ANSWER: ClassVar[tuple[int, int]] = (3, 4)  # False, True

    @property
    def seq_len(self) -> int:
        return self.length + 1

    @property
    def vocab_size(self) -> int:
        return 5

    @classmethod
    def balanced(cls, parens: Tensor) -> Tensor:
        """(B,) bool: no prefix closes more than it opened, and it ends at depth 0."""
        depth = torch.where(parens == cls.OPEN, 1, -1).cumsum(1)
        return (depth.min(1).values >= 0) & (depth[:, -1] == 0)

    def _balanced_words(self, g: torch.Generator, n: int) -> Tensor:
        half = self.length // 2
        words = torch.empty(n, self.length, dtype=torch.long)
        opened = torch.zeros(n, dtype=torch.long)
        depth = torch.zeros(n, dtype=torch.long)
        for t in range(self.length):
            coin = torch.rand(n, generator=g) < 0.5
            must_open = depth == 0
            must_close = opened == half
            open_ = (must_open | coin) & ~must_close
            words[:, t] = torch.where(open_, self.OPEN, self.CLOSE)
            opened += open_.long()
            depth += torch.where(open_, 1, -1)
        return words

    def _rows(self, g: torch.Generator, n: int) -> Tensor:
        good = self._balanced_words(g, n)
        shuffled = good.gather(1, torch.rand(n, self.length, generator=g).argsort(1))
        noise = torch.randint(0, 2, (n, self.length), generator=g)
        kind = torch.randint(0, 4, (n, 1), generator=g)  # 2/4 balanced, 1/4 shuffle, 1/4 noise
        return torch.where(kind < 2, good, torch.where(kind == 2, shuffled, noise))

    def make(self, g: torch.Generator, size: int, split: str) -> Batch:
        parens = _take_split(self._rows, g, size, split)
        seq = torch.cat([parens, torch.full((size, 1), self.QUERY)], dim=1)
        label = torch.where(self.balanced(parens), self.ANSWER[1], self.ANSWER[0])
        return _last_position(seq, label)


@dataclass(frozen=True)
class MemorizeTask(Task):
    """``n^2`` random key/value pairs (paper 002): key ``(k1, k2)``, value in ``[n]``. Measured
    on the training set; ``bits_per_param = log2(n) n^2 acc / trainable params``."""

    name: ClassVar[str] = "memorize"
    inputs: ClassVar[str] = "tokens"
    metric: ClassVar[str] = "acc"
    higher_is_better: ClassVar[bool] = True
    sizes: ClassVar[dict[str, dict[str, Any]]] = {"smoke": {"n": 16}, "paper": {"n": 512}}
    n: int = 16

    @property
    def seq_len(self) -> int:
        return 2

    @property
    def vocab_size(self) -> int:
        return 2 * self.n  # first key token in [0, n), second in [n, 2n); values in [0, n)

    def table(self) -> Tensor:
        """The value of every key ``(k1, k2)``, fixed by the task seed."""
        return self._table

    @functools.cached_property
    def _table(self) -> Tensor:
        g = generator(self.seed, "train", -1)
        return torch.randint(0, self.n, (self.n, self.n), generator=g)

    def make(self, g: torch.Generator, size: int, split: str) -> Batch:
        keys = torch.randint(0, self.n, (size, 2), generator=g)
        seq = torch.stack([keys[:, 0], keys[:, 1] + self.n], dim=1)
        return _last_position(seq, self.table()[keys[:, 0], keys[:, 1]])

    def extra(self, metric: float, trainable_params: int) -> dict[str, float]:
        bits = (self.n**2) * torch.log2(torch.tensor(float(self.n))).item()
        return {"bits_per_param": bits * metric / trainable_params}


@functools.cache
def corpus() -> Tensor:
    """Python's own documentation topics (stdlib ``pydoc_data``), ~0.47 MB of English, as bytes."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).long()


@dataclass(frozen=True)
class LMTask(Task):
    """Byte-level language modelling on the stdlib's documentation topics: first 90% train,
    last 10% validation. Metric: validation cross-entropy (nats per byte)."""

    name: ClassVar[str] = "lm"
    inputs: ClassVar[str] = "tokens"
    metric: ClassVar[str] = "loss"
    higher_is_better: ClassVar[bool] = False
    sizes: ClassVar[dict[str, dict[str, Any]]] = {"smoke": {"length": 32},
                                                  "paper": {"length": 256}}
    length: int = 32

    @property
    def seq_len(self) -> int:
        return self.length

    @property
    def vocab_size(self) -> int:
        return 256

    def text(self, split: str) -> Tensor:
        data = corpus()
        cut = int(0.9 * len(data))
        return data[:cut] if split == "train" else data[cut:]

    def make(self, g: torch.Generator, size: int, split: str) -> Batch:
        data = self.text(split)
        start = torch.randint(0, len(data) - self.length - 1, (size, 1), generator=g)
        windows = data[start + torch.arange(self.length + 1)]
        return Batch(windows[:, :-1], windows[:, 1:],
                     torch.ones(size, self.length, dtype=torch.bool))

    def score(self, out: Tensor, b: Batch) -> tuple[float, int]:
        loss = F.cross_entropy(out[b.mask].float(), b.y[b.mask], reduction="sum")
        return float(loss), int(b.mask.sum())


TASKS: dict[str, type[Task]] = {cls.name: cls for cls in (
    NgramTask, KernelTask, DenoiseTask, InductionTask, RetrievalTask, ModAddTask, AdditionTask,
    DyckTask, MemorizeTask, ICLLinearTask, LMTask)}


def make_task(name: str, size: str = "smoke", seed: int = 0, **params: Any) -> Task:
    """The task ``name`` at ``size`` (``smoke`` or ``paper``), with parameters overridden."""
    if name not in TASKS:
        raise TaskError(f"unknown task {name!r}; choices: {', '.join(TASKS)}")
    cls = TASKS[name]
    if size not in cls.sizes:
        raise TaskError(f"unknown size {size!r} for {name}; choices: {', '.join(cls.sizes)}")
    valid = [f.name for f in dataclasses.fields(cls) if f.name != "seed"]
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise TaskError(f"unknown parameter {unknown[0]!r} for task {name}; valid: "
                        f"{', '.join(valid)}")
    return cls(seed=seed, **{**cls.sizes[size], **params})


def fit_arch(arch: ArchConfig, task: Task) -> ArchConfig:
    """``arch`` with its input/output and length wired to ``task`` (the layers are kept)."""
    return arch.with_io(task.io)
