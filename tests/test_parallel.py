"""ZeRO stages: the paper's Table 1, sharding rules, offload, and properties."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

from vrammath.compose.estimate import estimate
from vrammath.compose.setup import Setup
from vrammath.model.params import param_count
from vrammath.model.presets import load_model
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import K, N_d, P
from vrammath.terms.parallel import (
    convention_bytes,
    zero_communication_elements,
    zero_paper_bytes,
    zero_stage,
)

# ZeRO (arXiv:1910.02054) Table 1, 7.5B model, GB = 1e9 bytes: P_os, P_os+g, P_os+g+p as printed.
TABLE1_7B5 = {
    1: ("120", "120", "120"),
    4: ("52.5", "41.3", "30"),
    16: ("35.6", "21.6", "7.5"),
    64: ("31.4", "16.6", "1.88"),
    256: ("30.4", "15.4", "0.47"),
    1024: ("30.1", "15.1", "0.12"),
}


def _as_printed(value: float, printed: str) -> str:
    places = len(printed.split(".")[1]) if "." in printed else 0
    quant = Decimal(1).scaleb(-places)
    return str(Decimal(repr(value)).quantize(quant, rounding=ROUND_HALF_UP))


@pytest.mark.parametrize(("nd", "row"), TABLE1_7B5.items())
def test_zero_table1(nd: int, row: tuple[str, str, str]) -> None:
    for stage, printed in zip((1, 2, 3), row, strict=True):
        gb = float(zero_paper_bytes(stage).subs({P: 7.5e9, N_d: nd, K: 12})) / 1e9
        assert _as_printed(gb, printed) == printed


def test_vrammath_states_equal_paper_formula() -> None:
    """The composed estimate equals ZeRO's closed forms symbolically for every stage."""
    spec = load_model("llama-7b")
    for stage in range(4):
        est = estimate(Setup(spec, recipe="fp16-mixed", zero=stage, gpus=4))
        total = sum(
            (est.component(k).expr for k in ("weights", "gradients", "master", "optimizer")),
            start=sympy.Integer(0),
        )
        assert sympy.simplify(total - zero_paper_bytes(stage).subs(K, 12)) == 0


def test_fsdp_names() -> None:
    assert [zero_stage(n) for n in ("NO_SHARD", "SHARD_GRAD_OP", "full_shard")] == [0, 2, 3]
    with pytest.raises(InputError, match="^zero:"):
        zero_stage(4)
    with pytest.raises(InputError, match="^zero:"):
        zero_stage(True)


def test_communication() -> None:
    assert zero_communication_elements(2) == 2 * P
    assert zero_communication_elements(3) / zero_communication_elements(1) == sympy.Rational(3, 2)


def test_conventions() -> None:
    assert convention_bytes("megatron") == 18 * P
    assert convention_bytes("deepspeed", 2) == 2 * P + 18 * P / N_d
    assert convention_bytes("megatron-distopt").subs(N_d, 1) == 18 * P
    with pytest.raises(InputError, match="^convention"):
        convention_bytes("accelerate")


@given(
    name=st.sampled_from(["llama-7b", "qwen2-72b", "gpt2", "mistral-7b"]),
    recipe=st.sampled_from(["fp32", "bf16-mixed", "bf16-megatron", "bf16-pure"]),
    optimizer=st.sampled_from(["adamw", "sgd", "sgd-momentum", "adam8bit", "adafactor"]),
    stage=st.integers(0, 3),
    n=st.integers(1, 512),
)
def test_more_ranks_never_cost_more(
    name: str, recipe: str, optimizer: str, stage: int, n: int
) -> None:
    spec = load_model(name)
    fewer = estimate(Setup(spec, recipe=recipe, optimizer=optimizer, zero=stage, gpus=n))
    more = estimate(Setup(spec, recipe=recipe, optimizer=optimizer, zero=stage, gpus=n + 1))
    assert more.model_state_bytes <= fewer.model_state_bytes
    if stage < 3:
        nxt = estimate(Setup(spec, recipe=recipe, optimizer=optimizer, zero=stage + 1, gpus=n))
        assert nxt.model_state_bytes <= fewer.model_state_bytes


def test_paper_stage_bytes_never_increase() -> None:
    for nd in (1, 2, 8, 64):
        vals = [zero_paper_bytes(k).subs({P: 1, K: 12, N_d: nd}) for k in range(4)]
        assert vals == sorted(vals, reverse=True)


def test_llama7b_zero2_by_hand() -> None:
    psi = param_count(load_model("llama-7b"))
    est = estimate(Setup(load_model("llama-7b"), zero=2, gpus=4))
    assert est.model_state_bytes == 2 * psi + (2 + 4 + 8) * psi // 4
