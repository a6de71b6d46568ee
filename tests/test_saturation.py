"""Softmax saturation: the Jacobian bound holds, and the reduced qk_dim never grows with N."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from alloc.saturation import (
    attention_error,
    jacobian_bound,
    parse_spectrum,
    power_spectrum,
    reduced_qk_dim,
)
from arch.errors import KernelError


@pytest.mark.parametrize("seed", range(20))
def test_softmax_jacobian_respects_the_bound(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, r = int(rng.integers(2, 400)), float(rng.uniform(0.1, 3))
    z = rng.uniform(-r, r, size=n)
    s = np.exp(z - z.max())
    s /= s.sum()
    jac = np.diag(s) - np.outer(s, s)
    norm = np.linalg.norm(jac, 2)
    assert norm <= 2 * np.max(s * (1 - s)) + 1e-12  # Gershgorin
    assert norm <= jacobian_bound(n, r) + 1e-12


def test_the_bound_is_capped_at_one_half_for_sharp_softmaxes() -> None:
    z = np.array([30.0, 0.0, 0.0, -30.0])  # R = 30: 2 e^60 / 4 is vacuous
    s = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    assert np.linalg.norm(np.diag(s) - np.outer(s, s), 2) <= jacobian_bound(4, 30.0) == 0.5
    assert jacobian_bound(256, 2.0) == pytest.approx(2 * math.exp(4) / 256)  # below 1/2


def test_jacobian_bound_falls_like_one_over_n() -> None:
    values = [jacobian_bound(n, 1.0) for n in (64, 128, 256)]
    assert values[0] / values[1] == pytest.approx(2) and values[1] / values[2] == pytest.approx(2)


@settings(max_examples=300, deadline=None)
@given(qk=st.sampled_from([8, 16, 32, 64, 128]), beta=st.floats(0, 3),
       r=st.floats(0.1, 3), tol=st.floats(1e-4, 1.0), align=st.sampled_from([1, 2, 4, 8]),
       n=st.integers(1, 4096), factor=st.integers(2, 16))
def test_qk_dim_never_grows_with_seq_len(qk: int, beta: float, r: float, tol: float,
                                         align: int, n: int, factor: int) -> None:
    sigma = power_spectrum(qk, beta, r)
    short = reduced_qk_dim(sigma, n, r, tol, align)
    long = reduced_qk_dim(sigma, n * factor, r, tol, align)
    assert long <= short
    for chosen, length in ((short, n), (long, n * factor)):
        assert attention_error(sigma, chosen, length, r) <= tol or chosen == qk
        smaller = chosen - align
        if chosen < qk and smaller >= align:  # minimality
            assert attention_error(sigma, smaller, length, r) > tol


def test_power_spectrum_is_normalised_and_decreasing() -> None:
    sigma = power_spectrum(64, 1.5, 2.0)
    assert math.isclose(sigma.sum(), 2.0) and (np.diff(sigma) <= 0).all()


def test_spectrum_specs(tmp_path: object) -> None:
    assert parse_spectrum("power:1") == ("power", 1.0)
    for bad in ("power:-1", "power:x", "flat"):
        with pytest.raises(KernelError):
            parse_spectrum(bad)
