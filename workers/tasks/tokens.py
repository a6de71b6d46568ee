"""Token tasks: induction, retrieval (needle in a haystack), modular and decimal addition,
Dyck-1 and memorization of random key/value pairs."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from workers.errors import TaskError
from workers.tasks.base import Batch, Task, generator, last_position, take_split


@dataclass(frozen=True)
class InductionTask(Task):
    """A random pattern repeated twice (Yu et al., 2025, App. E.1); next-token accuracy on the
    repeat."""

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

        pattern = take_split(rows, g, size, split)
        seq = torch.cat([pattern, pattern, pattern[:, : self.length - 2 * half]], dim=1)
        y = torch.zeros_like(seq)
        y[:, :-1] = seq[:, 1:]
        mask = torch.zeros_like(seq, dtype=torch.bool)
        mask[:, half : self.length - 1] = True  # tokens predictable by copying the first half
        return Batch(seq, y, mask)


@dataclass(frozen=True)
class RetrievalTask(Task):
    """Needle in a haystack (Dong et al., 2025): ``m ~ U{1..m_max}`` key/value pairs, then a query
    key; answer its value. Keys in ``[V/2, V)`` (distinct within a sequence), values in
    ``[1, V/2)``, 0 pads on the left.

    Training can be denser than the single query the task is evaluated on: ``queries = K``
    appends K queried pairs (``... k1 v1 k2 v2 ... kK``, each value predicted at its key), and
    ``ramp = S`` grows the number of pairs from ``ramp_from`` to ``m_max`` over the first S
    training batches (a curriculum). Validation is always one query over up to ``m_max`` pairs;
    train and validation never share a context.
    """

    name: ClassVar[str] = "retrieval"
    inputs: ClassVar[str] = "tokens"
    metric: ClassVar[str] = "acc"
    higher_is_better: ClassVar[bool] = True
    sizes: ClassVar[dict[str, dict[str, Any]]] = {
        "smoke": {"m_max": 4}, "paper": {"m_max": 20}}
    m_max: int = 4
    vocab: int = 256
    queries: int = 1
    ramp: int = 0
    ramp_from: int = 1

    def __post_init__(self) -> None:
        if self.queries < 1 or self.ramp < 0 or not 1 <= self.ramp_from <= self.m_max:
            raise TaskError(f"retrieval: queries {self.queries} >= 1, ramp {self.ramp} >= 0 and "
                            f"1 <= ramp_from {self.ramp_from} <= m_max {self.m_max}")

    @property
    def seq_len(self) -> int:
        return 2 * self.m_max + 2 * self.queries - 1

    @property
    def vocab_size(self) -> int:
        return self.vocab

    def pairs_at(self, index: int) -> int:
        """The most pairs a training batch ``index`` holds (the curriculum)."""
        if not self.ramp:
            return self.m_max
        share = min(1.0, index / self.ramp)
        return round(self.ramp_from + share * (self.m_max - self.ramp_from))

    def _contexts(self, g: torch.Generator, n: int, most: int) -> Tensor:
        """(n, 2 m_max): the last m ~ U{1..most} key/value pairs used, the rest zero."""
        half, m_max = self.vocab // 2, self.m_max
        keys = torch.rand(n, half, generator=g).argsort(-1)[:, :m_max] + half
        values = torch.randint(1, half, (n, m_max), generator=g)
        m = torch.randint(1, most + 1, (n, 1), generator=g)
        active = torch.arange(m_max)[None, :] >= m_max - m
        return torch.stack([keys * active, values * active], dim=-1).reshape(n, 2 * m_max)

    def batch(self, split: str, index: int, size: int) -> Batch:
        g = generator(self.seed, split, index)
        most = self.m_max if split == "val" else self.pairs_at(index)
        count = 1 if split == "val" else self.queries
        context = take_split(lambda gen, n: self._contexts(gen, n, most), g, size, split)
        keys, values = context[:, 0::2], context[:, 1::2]
        m = (keys > 0).sum(1, keepdim=True)
        pick = self.m_max - 1 - (torch.rand(size, count, generator=g) * m).long()
        asked, answer = keys.gather(1, pick), values.gather(1, pick)  # (B, K)
        tail = torch.stack([asked, answer], dim=-1).reshape(size, 2 * count)[:, :-1]
        seq = torch.cat([context, tail], dim=1)
        y, mask = torch.zeros_like(seq), torch.zeros_like(seq, dtype=torch.bool)
        at = 2 * self.m_max + 2 * torch.arange(count)  # each query key's position
        y[:, at], mask[:, at] = answer, True
        return Batch(seq, y, mask)

    def answer(self, seq: Tensor) -> Tensor:
        """The value that follows the (last) query key in the prefix (single-query rows)."""
        keys, values = seq[:, 0:-1:2], seq[:, 1:-1:2]
        hit = keys == seq[:, -1:]
        return (values * hit).sum(1)


@dataclass(frozen=True)
class ModAddTask(Task):
    """``(a + b) mod p`` (Dong et al., 2025: p = 599): a fixed random split of all pairs."""

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
                            f"fit in the p^2 = {self.p**2} pairs (p = {self.p}); set the "
                            "parameters train and val")

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
        return last_position(seq, ab.sum(1) % self.p)


@dataclass(frozen=True)
class AdditionTask(Task):
    """``a + b = c`` with n-digit numbers (Dong et al., 2025: ten digits); exact match of all
    digits of ``c`` (teacher-forced argmax right everywhere = greedy decoding right)."""

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
        ab = take_split(self._rows, g, size, split)
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
    """Is a parenthesis sequence balanced (Dyck-1, Dong et al., 2025: length 40)? Half the
    candidates are random balanced words, the rest shuffles or random strings; labels by a
    checker."""

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
        parens = take_split(self._rows, g, size, split)
        seq = torch.cat([parens, torch.full((size, 1), self.QUERY)], dim=1)
        label = torch.where(self.balanced(parens), self.ANSWER[1], self.ANSWER[0])
        return last_position(seq, label)


@dataclass(frozen=True)
class MemorizeTask(Task):
    """``n^2`` random key/value pairs (Dong et al., 2025): key ``(k1, k2)``, value in ``[n]``.
    Measured on the training set; ``bits_per_param = log2(n) n^2 acc / trainable params``."""

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
        return last_position(seq, self.table()[keys[:, 0], keys[:, 1]])

    def extra(self, metric: float, trainable_params: int) -> dict[str, float]:
        return {"bits_per_param": bits_per_param(self.n, metric, trainable_params)}


def bits_per_param(n: int, accuracy: float, trainable_params: int) -> float:
    """Bits stored per trainable parameter when ``accuracy`` of ``n^2`` random values in
    ``[n]`` are recalled: ``n^2 log2(n) accuracy / params`` (docs/theory.md §8)."""
    return n * n * math.log2(n) * accuracy / trainable_params
