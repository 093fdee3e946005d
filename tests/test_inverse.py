"""Inverse problems: every answer verified by substituting it back, on the GPU and the host."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

from vrammath.answers.budget import (
    budget,
    host_check,
)
from vrammath.answers.fit import fewest_gpus, largest_micro_batch, longest_sequence
from vrammath.answers.inverse import largest, smallest
from vrammath.compose.estimate import Estimate, estimate
from vrammath.compose.setup import Setup, with_changes
from vrammath.model.presets import load_model
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import N_d, P, b, h, s

MODELS = ("gpt2", "llama-7b", "qwen2-7b", "llama-2-70b", "qwen2-72b")
GPUS = ("RTX-4090-24GB", "A100-40GB", "A100-80GB", "H200-141GB")

TEXT: Any = "A100-80GB"  # text where an object belongs: the API must refuse it


def fits(est: Estimate, values: dict[sympy.Symbol, int], limit: int) -> bool:
    """Back-substitution through estimate() itself: the setup with the answer, re-estimated."""
    changes = {"micro_batch": values[b]} if b in values else {"seq_len": values[s]}
    return estimate(with_changes(est.setup, **changes)).gpu_bytes <= limit


# --- fewest GPUs: back-substitution through estimate() itself -----------------------------------


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("card", ["A100-40GB", "A100-80GB"])
def test_fewest_gpus_back_substitution(model: str, stage: int, card: str) -> None:
    setup = Setup(load_model(model), zero=stage, gpus=8, gpu=card)
    sol = fewest_gpus(estimate(setup))
    limit = budget(card).usable
    if sol.status == "none-fits":
        # even an unbounded number of ranks leaves the unsharded part too big
        assert not estimate(with_changes(setup, gpus=2**20)).gpu_bytes <= limit
        return
    assert sol.status == "ok"
    assert sol.value is not None
    assert sol.verified
    assert estimate(with_changes(setup, gpus=sol.value)).gpu_bytes == sol.bytes <= limit
    if sol.value > 1:
        assert estimate(with_changes(setup, gpus=sol.value - 1)).gpu_bytes > limit
        assert sol.method == "closed-form"  # A + B/N_d clears to a linear inequality


def test_fewest_gpus_zero0_is_one_or_none() -> None:
    small = estimate(Setup(load_model("gpt2"), gpu="A100-80GB"))
    assert fewest_gpus(small).value == 1
    big = fewest_gpus(estimate(Setup(load_model("llama-7b"), gpu="A100-80GB")))
    assert big.status == "none-fits"
    assert big.value is None
    assert "none fits" in str(big)


def test_fewest_gpus_multiple_of_node() -> None:
    est = estimate(Setup(load_model("qwen2-72b"), zero=3, gpus=8, gpu="A100-80GB"))
    sol = fewest_gpus(est, multiple_of=8)
    assert sol.value is not None
    assert sol.value % 8 == 0
    assert sol.verified
    assert sol.neighbour == sol.value - 8


# --- largest micro-batch / longest sequence on an estimate with b, s terms --------------------


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("card", GPUS)
def test_largest_micro_batch_back_substitution(model: str, card: str) -> None:
    base = estimate(Setup(load_model(model), zero=3, gpus=64, seq_len=2048, gpu=card))
    est = base
    limit = budget(card).usable
    sol = largest_micro_batch(est)
    if sol.status == "none-fits":
        assert not fits(est, {b: 1}, limit)
        return
    assert sol.value is not None
    assert sol.verified
    assert fits(est, {b: sol.value}, limit)
    assert not fits(est, {b: sol.value + 1}, limit)
    assert sol.method == "closed-form"  # linear in b


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("card", GPUS)
def test_longest_sequence_back_substitution(model: str, card: str) -> None:
    base = estimate(Setup(load_model(model), zero=3, gpus=64, gpu=card))
    est = base
    limit = budget(card, headroom=0.05).usable
    sol = longest_sequence(est, budget(card, headroom=0.05))
    if sol.status == "none-fits":
        assert not fits(est, {s: 1}, limit)
        return
    assert sol.value is not None
    assert sol.verified
    assert fits(est, {s: sol.value}, limit)
    assert not fits(est, {s: sol.value + 1}, limit)
    assert sol.method == "closed-form"  # quadratic in s (the 5as^2b attention scores)


def test_longest_sequence_multiple_of() -> None:
    est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=64, gpu="A100-80GB"))
    sol = longest_sequence(est, multiple_of=512)
    assert sol.value is not None
    assert sol.value % 512 == 0
    assert sol.verified
    assert sol.neighbour == sol.value + 512


def test_unbounded_without_b_terms() -> None:
    est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8, gpu="A100-80GB"))
    if b in est.gpu_expr().free_symbols:  # activations have been wired into estimate()
        sol = largest_micro_batch(est)
        assert sol.status in ("ok", "none-fits")
        if sol.value is not None:
            assert sol.verified
            limit = budget("A100-80GB").usable
            assert estimate(with_changes(est.setup, micro_batch=sol.value)).gpu_bytes <= limit
            assert estimate(with_changes(est.setup, micro_batch=sol.value + 1)).gpu_bytes > limit
        return
    sol = largest_micro_batch(est)
    assert sol.status == "unbounded"
    assert sol.method == "constant"
    assert "no limit" in str(sol)


def test_search_path_for_cubic() -> None:
    # degree 3 in b: no closed form is attempted; the exact search still verifies
    sol = largest([16 * P, 7 * b**3 + b], {P: 10**6}, b, 10**9)
    assert sol.method == "search"
    assert sol.verified
    assert sol.value == max(n for n in range(1, 600) if 16 * 10**6 + 7 * n**3 + n <= 10**9)


def test_ceiling_is_smoothed_then_verified() -> None:
    expr = 1000 * sympy.ceiling(b / 3) + 10
    sol = largest(expr, {}, b, 10_010)
    assert sol.value == 30
    assert sol.verified
    # a step wider than the nudges: the closed-form candidate is rejected, the search decides
    wide = largest(10**6 * sympy.ceiling(b / 1000), {}, b, 3_500_000)
    assert wide.method == "search"
    assert wide.value == 3000
    assert wide.verified


def test_none_fits_and_errors() -> None:
    assert largest([10 * b], {}, b, 5).status == "none-fits"
    with pytest.raises(InputError, match="values: must give a number for every symbol"):
        largest([b * h], {}, b, 10**9)
    with pytest.raises(InputError, match="multiple_of"):
        largest([b], {}, b, 10, multiple_of=0)
    with pytest.raises(InputError, match="gpu: name a GPU"):
        largest_micro_batch(estimate(Setup(load_model("gpt2"))))


# --- hypothesis: closed form and search agree with brute force ---------------------------------

coef = st.integers(min_value=0, max_value=10**6)


@given(
    c0=coef, c1=st.integers(1, 10**6), c2=coef, limit=st.integers(1, 10**9), den=st.integers(1, 7)
)
def test_largest_matches_brute_force(c0: int, c1: int, c2: int, limit: int, den: int) -> None:
    x = sympy.Symbol("x", positive=True, integer=True)
    terms = [sympy.Integer(c0), sympy.Rational(c1, den) * x, sympy.Rational(c2, den) * x**2]
    sol = largest(terms, {}, x, limit)

    def f(n: int) -> int:
        return (
            c0 + math.ceil(sympy.Rational(c1 * n, den)) + math.ceil(sympy.Rational(c2 * n * n, den))
        )

    if f(1) > limit:
        assert sol.status == "none-fits"
        return
    assert sol.value is not None
    assert sol.verified
    assert f(sol.value) <= limit < f(sol.value + 1)


@given(
    fixed=st.integers(0, 10**10),
    shard=st.integers(1, 10**12),
    limit=st.integers(1, 10**11),
    step=st.sampled_from([1, 2, 8]),
)
def test_smallest_matches_brute_force(fixed: int, shard: int, limit: int, step: int) -> None:
    sol = smallest([sympy.Integer(fixed), shard / N_d], {}, N_d, limit, multiple_of=step)

    def f(n: int) -> int:
        return fixed + -(-shard // n)

    if fixed + 1 > limit or (f(step * 2**40) > limit):
        assert sol.status == "none-fits" or (sol.value is not None and f(sol.value) <= limit)
        return
    assert sol.value is not None
    assert sol.verified
    assert sol.value % step == 0
    assert f(sol.value) <= limit
    if sol.value > step:
        assert f(sol.value - step) > limit


# --- the host side of offload answers -------------------------------------------------------


def test_fewest_gpus_bound_by_host_memory() -> None:
    setup = Setup(load_model("llama-2-70b"), zero=3, gpus=8, offload_optimizer=True)
    est = estimate(setup)
    bud = budget("A100-80GB", host_bytes=512 * 2**30)
    gpu_only = fewest_gpus(est, budget("A100-80GB", host_bytes=2**50))
    sol = fewest_gpus(est, bud)
    assert sol.verified
    assert sol.value is not None
    assert gpu_only.value is not None
    assert sol.value > gpu_only.value  # the host, not the GPU, decides here
    # back-substitution through estimate() and host_check() themselves
    at = estimate(with_changes(setup, gpus=sol.value))
    before = estimate(with_changes(setup, gpus=sol.value - 1))
    assert at.gpu_bytes == sol.bytes <= bud.usable
    assert host_check(at, bud).need == sol.host_bytes <= 512 * 2**30
    assert host_check(before, bud).fits is False
    assert "of host" in str(sol)


def test_largest_micro_batch_none_when_host_too_small() -> None:
    setup = Setup(load_model("llama-7b"), zero=3, gpus=8, offload_optimizer=True, gpu="A100-80GB")
    est = estimate(setup)
    roomy = largest_micro_batch(est)  # the A100-80GB's node: a DGX A100 640GB
    assert roomy.status == "ok"
    assert roomy.host_bytes == 8 * est.cpu_bytes
    assert roomy.host_limit == 2 * 2**40
    tiny = largest_micro_batch(est, budget("A100-80GB", host_bytes=2**30))
    assert tiny.status == "none-fits"
    assert tiny.host_bytes == 8 * est.cpu_bytes
    assert "the host needs" in str(tiny)
    assert not tiny.verified


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: largest("b*h", {}, b, 10), "expr: must be a sympy expression"),
        (lambda: largest([b], {}, "__import__('os')", 10), "unknown: must be one of P, V, h"),
        (lambda: largest([b], {"zz": 1}, b, 10), "values: must be one of"),
        (lambda: largest([b], {h: 0.5}, b, 10), "values: must map each symbol"),
        (lambda: largest([b], {}, b, 10.0), "limit: must be an integer"),
        (lambda: smallest([P / N_d], {P: 10}, "N_d", 1, multiple_of=0), "multiple_of"),
        (lambda: largest_micro_batch(TEXT), "est: must be an Estimate"),
    ],
)
def test_inverse_bad_input(call: Callable[[], object], message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        call()


def test_symbol_names_are_looked_up() -> None:
    sol = largest([16 * P, 3 * 10**9 * b], {"P": 10**9}, "b", 80 * 10**9)
    assert sol.unknown == b
    assert sol.value == 21
