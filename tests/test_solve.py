"""Inverse problems, sensitivities and sweeps: every answer verified by substituting it back."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from vrammath.budget import DEFAULT_RESERVE_BYTES, Budget, budget, exact_bytes
from vrammath.cli import main
from vrammath.errors import InputError
from vrammath.estimate import Estimate, estimate
from vrammath.inverse import (
    fewest_gpus,
    largest,
    largest_micro_batch,
    longest_sequence,
    smallest,
)
from vrammath.plan import candidates, cheapest_fit, fit, plan_cost
from vrammath.presets import gpu, load_model
from vrammath.setup import Setup, with_changes
from vrammath.sweep import compiled_cache_info, ranking, sensitivities, sweep
from vrammath.symbols import N_d, P, b, h, s

MODELS = ("gpt2", "llama-7b", "qwen2-7b", "llama-2-70b", "qwen2-72b")
GPUS = ("RTX-4090-24GB", "A100-40GB", "A100-80GB", "H200-141GB")


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


# --- the cheapest plan ------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["llama-7b", "llama-2-70b", "qwen2-72b"])
@pytest.mark.parametrize("card", ["A100-40GB", "A100-80GB"])
def test_cheapest_fit_is_first_that_fits(model: str, card: str) -> None:
    setup = Setup(load_model(model), gpus=8, gpu=card)
    plan = cheapest_fit(setup)
    limit = budget(card).usable
    assert all(not t.fits for t in plan.tried[:-1])
    costs = [t.cost for t in plan.tried]
    assert costs == sorted(costs)
    if plan.setup is None:
        assert not plan.tried[-1].fits
        return
    assert plan.estimate is not None
    assert estimate(plan.setup).gpu_bytes == plan.estimate.gpu_bytes <= limit
    assert plan.tried[-1].fits
    for cand in candidates(setup):
        if plan_cost(cand) < plan_cost(plan.setup):
            assert estimate(cand).gpu_bytes > limit


def test_cheapest_fit_ladder() -> None:
    # the 7B model at 8 GPUs: ZeRO-0 (16P + foreach temporaries) misses an A100-80GB, ZeRO-1 fits
    plan = cheapest_fit(Setup(load_model("llama-7b"), gpus=8, gpu="A100-80GB"))
    assert plan.label == "ZeRO-1"
    assert [t.label for t in plan.tried] == ["ZeRO-0", "ZeRO-1"]
    big = cheapest_fit(Setup(load_model("qwen2-72b"), gpus=8, gpu="A100-80GB"))
    assert big.setup is not None
    assert big.setup.zero == 3


def test_budget() -> None:
    bud = budget("A100-80GB", headroom=0.1)
    assert bud.usable == math.floor(gpu("A100-80GB").bytes * 0.9) - DEFAULT_RESERVE_BYTES
    assert Budget(10**9, reserve_bytes=0).usable == 10**9
    with pytest.raises(InputError, match=r"headroom: must be a fraction in \[0, 1\)"):
        Budget(10**9, headroom=1.0)
    with pytest.raises(InputError, match="reserve_bytes"):
        Budget(10**9, reserve_bytes=-1)
    with pytest.raises(InputError, match="gpu: must be one of"):
        budget("B200")


# --- sensitivities ----------------------------------------------------------------------------


def test_sensitivities_match_finite_differences() -> None:
    est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8, seq_len=4096))
    rows = {(x.component, str(x.knob)): x for x in sensitivities(est)}
    total_s = rows[("total", "s")]
    f = sympy.lambdify(s, est.gpu_expr().subs({k: v for k, v in est.values.items() if k != s}))
    fd = (f(4096 + 1) - f(4096 - 1)) / 2
    assert total_s.rate == pytest.approx(fd, rel=1e-9)
    assert rows[("optimizer", "N_d")].elasticity == pytest.approx(-1.0)
    assert rows[("weights", "b")].rate == 0
    # halving s saves what the exact re-evaluation says
    halved = exact_bytes([est.gpu_expr()], {**est.values, s: 2048})
    assert total_s.step_saving == exact_bytes([est.gpu_expr()], est.values) - halved


def test_stepwise_terms() -> None:
    # HF's loss keeps 8 more bytes at b = 1 only: derivative 0, the solve is still exact
    est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8, gpu="A100-80GB"))
    assert est.gpu_expr().has(sympy.KroneckerDelta)
    rows = {(x.component, str(x.knob)): x for x in sensitivities(est)}
    assert rows[("total", "b")].rate > 0
    sol = largest_micro_batch(est)
    assert sol.method == "closed-form"  # the delta is smoothed away, then checked exactly
    assert sol.verified
    assert sol.value is not None
    out = sweep(est, {"b": np.array([1, 2, sol.value, sol.value + 1])})
    expected = [
        estimate(with_changes(est.setup, micro_batch=n)).gpu_bytes
        for n in (1, 2, sol.value, sol.value + 1)
    ]
    assert out.tolist() == expected


def test_ranking_orders_by_step_saving() -> None:
    est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8, micro_batch=8))
    order = ranking(est)
    savings = [x.step_saving for x in order]
    assert savings == sorted(savings, reverse=True)
    assert {str(x.knob) for x in order} == {"b", "s", "N_d", "t", "p"}


# --- sweeps -----------------------------------------------------------------------------------


@settings(max_examples=15)  # each example re-runs estimate(): keep the suite inside CI's budget
@given(
    n_d=st.lists(st.integers(1, 4096), min_size=1, max_size=5),
    stage=st.sampled_from([0, 1, 2, 3]),
    model=st.sampled_from(MODELS),
)
def test_sweep_matches_estimate(n_d: list[int], stage: int, model: str) -> None:
    est = estimate(Setup(load_model(model), zero=stage, gpus=8))
    out = sweep(est, {"N_d": np.array(n_d)})
    expected = [estimate(with_changes(est.setup, gpus=n)).gpu_bytes for n in n_d]
    assert out.tolist() == expected


@settings(max_examples=15)  # each example substitutes into sympy: see above
@given(bs=st.lists(st.tuples(st.integers(1, 64), st.integers(1, 32768)), min_size=1, max_size=10))
def test_sweep_matches_exact_with_b_and_s(bs: list[tuple[int, int]]) -> None:
    est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8))
    arr = np.array(bs)
    out = sweep(est, {b: arr[:, 0], s: arr[:, 1]})
    expected = [exact_bytes([est.gpu_expr()], {**est.values, b: int(x), s: int(y)}) for x, y in bs]
    assert out.tolist() == expected


def test_sweep_broadcasts_and_caches() -> None:
    est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8))
    grid = sweep(est, {"b": np.arange(1, 5)[:, None], "s": np.array([512, 1024, 2048])[None, :]})
    assert grid.shape == (4, 3)
    assert grid.dtype == np.int64
    before = compiled_cache_info().hits
    # another model with the same structure shares the compiled function
    other = estimate(Setup(load_model("llama-2-7b"), zero=3, gpus=8))
    sweep(other, {"b": np.arange(1, 5)})
    assert compiled_cache_info().hits == before + 1
    with pytest.raises(InputError, match="axes: must name symbols"):
        sweep(est, {"r": np.arange(3)})


# --- CLI --------------------------------------------------------------------------------------


def test_cli_fit(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["fit", "llama-7b", "--gpu", "A100-80GB", "--gpus", "8"])
    out, err = capsys.readouterr()
    assert code == 0
    assert err == ""
    lines = out.splitlines()
    assert re.match(r"which stage: ZeRO-[0-3].* on 8 GPU\(s\)", lines[1])
    assert lines[2].startswith("largest micro-batch:")
    assert lines[3].startswith("longest sequence:")
    assert re.match(r"fewest GPUs: N_d = \d+ ", lines[4])
    assert "peak per GPU" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["fit", "llama-7b"], "gpu: must be one of"),
        (["fit", "llama-7b", "--gpu", "A100-80GB", "--headroom", "1.5"], "headroom"),
        (["fit", "llama-7b", "--gpu", "A100-80GB", "--reserve-gib", "x"], "reserve-gib"),
        (["fit", "llama-7b", "--gpu", "B300"], "gpu: must be one of"),
    ],
)
def test_cli_fit_bad_input(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    try:
        code = main(args)
    except SystemExit as exc:  # argparse errors exit directly
        code = int(exc.code or 0)
    _, err = capsys.readouterr()
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_fit_answers_are_consistent() -> None:
    answer = fit(Setup(load_model("llama-2-70b"), gpus=8, gpu="H200-141GB"))
    assert answer.plan.setup is not None
    assert answer.basis.setup == answer.plan.setup
    assert answer.gpus.verified
