"""Regression tasks on vector sequences: memory kernels (ngram, kernel), denoising a mixture
of low-rank Gaussians, and in-context linear regression."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from arch import parse_kernel
from workers.tasks.base import Batch, Task, generator


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
    """Yu et al. (2025), §6.1: the sum of the previous four tokens plus noise."""

    name: ClassVar[str] = "ngram"
    kernel: str = "ngram:4"


@dataclass(frozen=True)
class DenoiseTask(Task):
    """A mixture of low-rank Gaussians (docs/theory.md §7): tokens from K noisy orthogonal
    subspaces; predict the clean signal.

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
        snr = cluster_snr(out.float(), self.bases().to(out.device), b.aux)
        return float(snr.sum()), int(snr.numel())


def cluster_snr(z: Tensor, bases: Tensor, labels: Tensor) -> Tensor:
    """Per sequence, the mean over its clusters of ``||P_k Z_k||_F / ||(I - P_k) Z_k||_F``
    (docs/theory.md §7): the signal of cluster k's tokens in its subspace over the rest.
    z: (B, T, d), bases: (K, d, p), labels: (B, T) -> (B,)."""
    ratios, present = [], []
    for k in range(bases.shape[0]):
        mask = (labels == k)[..., None].to(z.dtype)  # (B, T, 1)
        zk = z * mask
        inside = zk @ bases[k] @ bases[k].T
        ratios.append(inside.norm(dim=(1, 2)) / (zk - inside).norm(dim=(1, 2)).clamp_min(1e-12))
        present.append(mask.sum((1, 2)) > 0)
    ratio, seen = torch.stack(ratios, 1), torch.stack(present, 1).to(z.dtype)
    return (ratio * seen).sum(1) / seen.sum(1).clamp_min(1)


@dataclass(frozen=True)
class ICLLinearTask(Task):
    """In-context linear regression (Wang et al., 2025, §4.2.2): tokens ``x_1, y_1, x_2, y_2, ...``;
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
