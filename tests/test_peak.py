"""Phase peaks of a training step (pure formulas, no torch)."""

from __future__ import annotations

import pytest
import sympy

from vrammath.errors import InputError
from vrammath.peak import peak_bytes, phase_bytes, step_phases
from vrammath.presets import load_model
from vrammath.states import model_state_bytes, optimizer_step_temp_bytes


def test_step_peak_is_states_plus_gradients_plus_temporaries() -> None:
    spec = load_model("llama-7b")
    st = model_state_bytes(spec, "bf16-pure", "adamw")
    temps = optimizer_step_temp_bytes(spec, "bf16-pure", "adamw", "foreach")
    ph = phase_bytes(step_phases(spec, precision="bf16"), spec, batch=1, seq=512)
    assert ph["step_peak"] == st["weights"] + st["gradients"] + st["optimizer"] + temps


def test_first_iteration_has_no_states_before_its_step() -> None:
    spec = load_model("llama-7b")
    steady = phase_bytes(step_phases(spec), spec, batch=1, seq=512)
    first = phase_bytes(step_phases(spec, iteration="first"), spec, batch=1, seq=512)
    opt = model_state_bytes(spec, "bf16-pure", "adamw")["optimizer"]
    assert steady["forward_end"] - first["forward_end"] == opt
    assert steady["step_peak"] == first["step_peak"]


def test_fused_adds_no_temporaries_and_zero3_divides_states() -> None:
    spec = load_model("llama-7b")
    fused = phase_bytes(step_phases(spec, implementation="fused"), spec, batch=1, seq=512)
    st = model_state_bytes(spec, "bf16-pure", "adamw")
    assert fused["step_peak"] == sum(st.values())
    z3 = phase_bytes(
        step_phases(spec, implementation="fused", zero3_ranks=8), spec, batch=1, seq=512
    )
    assert z3["step_peak"] == pytest.approx(sum(st.values()) / 8, abs=1)


def test_peak_is_the_largest_phase_and_forward_grows_with_sequence() -> None:
    spec = load_model("qwen2-72b")
    ph = step_phases(spec, precision="bf16", recompute="full")
    short = phase_bytes(ph, spec, batch=1, seq=512)
    long_ = phase_bytes(ph, spec, batch=1, seq=4096)
    assert long_["forward_end"] > short["forward_end"]
    assert sympy.ceiling(peak_bytes(ph, spec, batch=1, seq=4096)) == max(long_.values())


def test_unknown_options_raise() -> None:
    spec = load_model("gpt2")
    with pytest.raises(InputError, match="iteration"):
        step_phases(spec, iteration="third")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="precision"):
        step_phases(spec, precision="int8")  # type: ignore[arg-type]
