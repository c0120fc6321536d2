"""Bi-Level reshaping: exactness against a per-row reference from OAR_SPEC §4, properties, edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oar import bilevel_weights, masked_quantile, weight_stats


def reference_row(scores: np.ndarray, tau=0.25, beta=1.0, floor=0.1) -> np.ndarray:
    """OAR_SPEC §4 for one completion's reasoning tokens, written plainly."""
    L = len(scores)
    if L < 2 or not np.all(np.isfinite(scores)):
        return np.ones(L)
    s = np.log1p(np.maximum(scores, 0.0))
    if s.max() - s.min() <= np.finfo(s.dtype).tiny:  # all equal (a subnormal spread counts as none)
        return np.ones(L)
    u = (s - s.min()) / (s.max() - s.min())
    theta = np.quantile(u, tau)  # linear interpolation
    w = np.empty(L)
    for t in range(L):
        if u[t] < theta:
            w[t] = max(u[t] / theta, floor)
        else:
            w[t] = 1 + beta * (u[t] - theta) / (1 - theta) if theta < 1 else 1.0
    return w * L / w.sum()


def padded_batch(rows: list[np.ndarray], width: int, offsets: list[int] | None = None):
    B = len(rows)
    scores = torch.full((B, width), 7.0, dtype=torch.float64)  # junk in padding must not matter
    mask = torch.zeros(B, width, dtype=torch.bool)
    for i, r in enumerate(rows):
        o = 0 if offsets is None else offsets[i]
        scores[i, o : o + len(r)] = torch.from_numpy(r)
        mask[i, o : o + len(r)] = True
    return scores, mask


scores_strategy = st.lists(
    st.one_of(
        st.floats(min_value=-2.0, max_value=50.0, allow_nan=False),
        st.sampled_from([0.0, 1e-12, 1.0, 3.0]),  # ties
    ),
    min_size=0,
    max_size=24,
)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(scores_strategy, min_size=1, max_size=6),
    extra=st.integers(0, 5),
    tau=st.floats(0.05, 0.95),
    beta=st.floats(0.0, 3.0),
    floor=st.floats(0.0, 1.0),
)
def test_matches_reference_and_properties(rows, extra, tau, beta, floor):
    rows = [np.asarray(r, dtype=np.float64) for r in rows]
    width = max(len(r) for r in rows) + extra
    scores, mask = padded_batch(rows, width)
    w = bilevel_weights(scores, mask, tau=tau, beta=beta, floor=floor)
    assert w.dtype == torch.float64 and w.shape == scores.shape
    assert torch.equal(w[~mask], torch.ones_like(w[~mask]))  # outside the mask untouched
    assert (w >= 0).all()
    for i, r in enumerate(rows):
        ref = reference_row(r, tau, beta, floor)
        got = w[i, : len(r)].numpy()
        assert np.max(np.abs(got - ref), initial=0.0) <= 1e-6
        if len(r):
            assert abs(got.mean() - 1.0) <= 1e-9  # mass preservation
        order = np.argsort(r, kind="stable")
        assert np.all(np.diff(got[order]) >= -1e-9)  # monotone in score
    # a row's weights depend neither on its neighbours nor on padding
    for i, r in enumerate(rows):
        alone = bilevel_weights(*padded_batch([r], len(r) + 3), tau=tau, beta=beta, floor=floor)
        assert torch.allclose(alone[0, : len(r)], w[i, : len(r)], atol=1e-12, rtol=0)


def test_a_subnormal_spread_counts_as_all_equal():
    """Hypothesis found [0, 5e-324]: a spread below the smallest normal number gives uniform weights."""
    for dtype in (torch.float64, torch.float32):
        tiny = torch.finfo(dtype).tiny
        scores = torch.tensor([[0.0, tiny / 4, 0.0], [0.0, 1.0, 0.5]], dtype=dtype)
        w = bilevel_weights(scores, torch.ones_like(scores, dtype=torch.bool), tau=0.5, beta=0.0, floor=0.0)
        assert torch.equal(w[0], torch.ones(3, dtype=dtype))
        assert w[1, 0] == 0 and w[1, 1] > 1  # a resolvable spread is still reshaped


@settings(max_examples=60, deadline=None)
@given(r=st.lists(st.floats(0.0, 10.0), min_size=2, max_size=16), shift=st.integers(0, 6))
def test_left_or_right_padding_gives_same_weights(r, shift):
    r = np.asarray(r)
    a = bilevel_weights(*padded_batch([r], len(r) + 6, offsets=[0]))
    b = bilevel_weights(*padded_batch([r], len(r) + 6, offsets=[shift]))
    assert torch.allclose(a[0, : len(r)], b[0, shift : shift + len(r)], atol=1e-12, rtol=0)


@settings(max_examples=60, deadline=None)
@given(r=st.lists(st.floats(0.0, 10.0), min_size=2, max_size=16))
def test_monotone_before_renormalisation(r):
    # with floor 0 and beta 0 the pre-normalisation weights are min(u / theta, 1): check the shape directly
    r = np.asarray(r)
    w = bilevel_weights(*padded_batch([r], len(r)), beta=0.0, floor=0.0)[0].numpy()
    order = np.argsort(r, kind="stable")
    assert np.all(np.diff(w[order]) >= -1e-12)


def test_uniform_scores_beta_zero_all_ones():
    scores = torch.full((3, 10), 0.5)
    mask = torch.ones(3, 10, dtype=torch.bool)
    assert torch.equal(bilevel_weights(scores, mask, beta=0.0), torch.ones(3, 10))


def test_known_values():
    # u = [0, 1/3, 2/3, 1] after log1p + min-max of scores e^{0,1,2,3}-1; theta = quantile_.25 = 0.25
    scores = torch.tensor([[math.expm1(0), math.expm1(1), math.expm1(2), math.expm1(3)]], dtype=torch.float64)
    mask = torch.ones_like(scores, dtype=torch.bool)
    raw = np.array([0.1, 1 + (1 / 3 - 0.25) / 0.75, 1 + (2 / 3 - 0.25) / 0.75, 2.0])
    expected = raw * 4 / raw.sum()
    assert np.allclose(bilevel_weights(scores, mask).numpy()[0], expected, atol=1e-12)


@pytest.mark.parametrize(
    "row, mask_row",
    [
        ([1.0, 2.0, 3.0], [False, False, False]),  # empty mask
        ([1.0, 2.0, 3.0], [False, True, False]),  # one token
        ([2.0, 2.0, 2.0], [True, True, True]),  # all equal
        ([1.0, float("nan"), 3.0], [True, True, True]),  # NaN
        ([1.0, float("inf"), 3.0], [True, True, True]),  # Inf
        ([0.0, 0.0, 0.0], [True, True, True]),  # zeros
        ([-1.0, -5.0, 0.0], [True, True, True]),  # negatives clamp to 0: all equal
    ],
)
def test_degenerate_rows_get_ones(row, mask_row):
    w = bilevel_weights(torch.tensor([row]), torch.tensor([mask_row]))
    assert torch.equal(w, torch.ones(1, 3))


def test_nonfinite_outside_mask_is_ignored():
    scores = torch.tensor([[float("nan"), 1.0, 5.0, float("inf")]])
    mask = torch.tensor([[False, True, True, False]])
    w = bilevel_weights(scores, mask)
    assert torch.isfinite(w).all() and w[0, 0] == 1 and w[0, 3] == 1 and w[0, 1] < 1 < w[0, 2]


def test_huge_scores_are_finite_and_mean_one():
    scores = torch.tensor([[1e30, 1.0, 0.0, 1e10, 5.0]], dtype=torch.float32)
    mask = torch.ones_like(scores, dtype=torch.bool)
    w = bilevel_weights(scores, mask)
    assert torch.isfinite(w).all()
    assert abs(w.mean().item() - 1) < 1e-6 and w.argmax().item() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_dtype_kept(dtype):
    scores = torch.rand(4, 9).to(dtype)
    w = bilevel_weights(scores, torch.ones(4, 9, dtype=torch.bool))
    assert w.dtype == dtype and w.device == scores.device


def test_masked_quantile_matches_numpy():
    gen = torch.Generator().manual_seed(0)
    values = torch.rand(5, 12, generator=gen, dtype=torch.float64)
    mask = torch.rand(5, 12, generator=gen) > 0.4
    mask[0] = False
    q = masked_quantile(values, mask, 0.3)
    assert torch.isnan(q[0])
    for i in range(1, 5):
        if mask[i].any():
            assert abs(q[i].item() - np.quantile(values[i][mask[i]].numpy(), 0.3)) < 1e-12


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(tau=0.0), "tau must be in"),
        (dict(tau=1.0), "tau must be in"),
        (dict(beta=-0.1), "beta must be >= 0"),
        (dict(floor=1.5), "floor must be in"),
        (dict(floor=-0.1), "floor must be in"),
    ],
)
def test_bad_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bilevel_weights(torch.rand(2, 3), torch.ones(2, 3, dtype=torch.bool), **kwargs)


def test_bad_shapes_and_dtypes():
    with pytest.raises(ValueError, match="mask shape"):
        bilevel_weights(torch.rand(2, 3), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool tensor"):
        bilevel_weights(torch.rand(2, 3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="floating point"):
        bilevel_weights(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        bilevel_weights(torch.rand(3), torch.ones(3, dtype=torch.bool))


def test_weight_stats():
    w = torch.tensor([[0.5, 0.5, 2.0, 1.0], [1.0, 1.0, 1.0, 9.0]])
    mask = torch.tensor([[True, True, True, True], [True, True, True, False]])
    s = weight_stats(w, mask)
    vals = np.array([0.5, 0.5, 2.0, 1.0, 1.0, 1.0, 1.0])
    assert s["mean"] == pytest.approx(vals.mean())
    assert s["std"] == pytest.approx(vals.std())
    assert s["max"] == 2.0 and s["min"] == 0.5
    assert s["frac_suppressed"] == pytest.approx(2 / 7)
    assert s["frac_floor"] == pytest.approx(2 / 7)  # row 2 is uniform over its mask: no floor
    assert s["ess_ratio"] == pytest.approx(vals.sum() ** 2 / (7 * (vals**2).sum()))
    srt = np.sort(vals)
    gini = ((2 * np.arange(1, 8) - 8) * srt).sum() / (7 * srt.sum())
    assert s["gini"] == pytest.approx(gini)
    assert weight_stats(w, torch.zeros_like(mask))["ess_ratio"] == 0.0
    ones = weight_stats(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool))
    assert ones["ess_ratio"] == pytest.approx(1.0) and ones["gini"] == pytest.approx(0.0)
