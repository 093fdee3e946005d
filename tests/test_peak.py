"""Phase peaks of a training step (pure formulas, no torch), through estimate()."""

from __future__ import annotations

import pytest
import sympy

from vrammath.compose.estimate import estimate
from vrammath.compose.peak import Groups, hf_phase_peaks, korthikanti_phase_peaks
from vrammath.compose.setup import Setup, with_changes
from vrammath.compose.table import TERMS
from vrammath.model.params import param_count
from vrammath.model.presets import load_model
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import P, b, h, s
from vrammath.terms.states import model_state_bytes, optimizer_step_temp_bytes


def pure(spec: ModelSpec, implementation: str = "foreach", **kw: object) -> Setup:
    """bf16 weights, gradients and states (no master copy), 512 tokens: the measured recipe."""
    return with_changes(
        Setup(spec, recipe="bf16-pure", seq_len=512, implementation=implementation), **kw
    )


def test_step_peak_is_states_plus_gradients_plus_temporaries() -> None:
    spec = load_model("llama-7b")
    st = model_state_bytes(spec, "bf16-pure", "adamw")
    temps = optimizer_step_temp_bytes(spec, "bf16-pure", "adamw", "foreach")
    ph = estimate(pure(spec)).phases
    assert ph["step_peak"] == st["weights"] + st["gradients"] + st["optimizer"] + temps


def test_first_iteration_has_no_states_before_its_step() -> None:
    spec = load_model("llama-7b")
    steady = estimate(pure(spec)).phases
    first = estimate(pure(spec, iteration="first")).phases
    opt = model_state_bytes(spec, "bf16-pure", "adamw")["optimizer"]
    assert steady["forward_peak"] - first["forward_peak"] == opt
    assert steady["backward_peak"] - first["backward_peak"] == opt
    assert steady["step_peak"] == first["step_peak"]


def test_fused_adds_no_temporaries_and_zero3_divides_states() -> None:
    spec = load_model("llama-7b")
    fused = estimate(pure(spec, "fused"))
    st = model_state_bytes(spec, "bf16-pure", "adamw")
    assert fused.phases["step_peak"] == sum(st.values())
    z3 = estimate(pure(spec, "fused", zero=3, gpus=8, seq_len=16))
    assert z3.phases["step_peak"] == pytest.approx(sum(st.values()) / 8, abs=1)


def test_zero3_backward_end_holds_gathered_layers_and_one_reduce_buffer() -> None:
    # the reduce buffer is a phase transient, not a listed component
    spec = load_model("llama-7b")
    z3 = estimate(pure(spec, "fused", zero=3, gpus=8, seq_len=16))
    assert "reduce_buffer" not in [c.key for c in z3.components]
    assert z3.component("gathered").bytes == 2 * 2 * 202383360  # two llama-7b layers in bf16
    without = estimate(
        pure(spec, "fused", zero=3, gpus=8, seq_len=16),
        terms=tuple(t for t in TERMS if t.key != "reduce_buffer"),
    )
    # at 16 tokens the end of backward is the peak: one layer's bf16 gradients more
    assert z3.phases["backward_peak"] - without.phases["backward_peak"] == 2 * 202383360
    assert z3.phases["forward_peak"] == without.phases["forward_peak"]


def test_one_gpu_peaks_at_the_step_and_forward_grows_with_sequence() -> None:
    spec = load_model("qwen2-72b")
    short = estimate(Setup(spec, recompute="full", seq_len=512))
    long_ = estimate(Setup(spec, recompute="full", seq_len=4096))
    assert long_.phases["forward_peak"] > short.phases["forward_peak"]
    # one GPU: the optimizer step peaks, at 2 + 2 + 4 + 8 bytes of states per parameter,
    # foreach AdamW's fp32 temporary of 4 and the masters' fp32 gradients, 4 for the 2 freed
    assert long_.peak_phase == "step_peak"
    assert long_.gpu_bytes == 22 * param_count(spec)


def test_korthikanti_backward_is_the_larger_of_activations_and_gradients() -> None:
    z = sympy.Integer(0)
    g = Groups(2 * P, 12 * P, 4 * P, 34 * s * b * h, 4 * P, z, z)
    ph = korthikanti_phase_peaks(g)
    assert ph["backward_peak"] == sympy.Max(14 * P + 34 * s * b * h, 18 * P)
    assert korthikanti_phase_peaks(g, iteration="first")["forward_peak"] == 2 * P + 34 * s * b * h
    assert ph["step_peak"] == 22 * P


def test_unknown_options_raise() -> None:
    z = sympy.Integer(0)
    g = Groups(z, z, z, z, z, z, z)
    with pytest.raises(InputError, match="iteration"):
        hf_phase_peaks(load_model("gpt2"), g, iteration="third")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="iteration"):
        korthikanti_phase_peaks(g, iteration="third")  # type: ignore[arg-type]


def test_every_matrix_row_within_its_target_of_the_committed_measurement() -> None:
    """estimate() of each validation-matrix row against the numbers PyTorch counted
    (validation/matrix.json): states exact, every phase peak within 1%."""
    import json
    from pathlib import Path

    from vrammath.measure.matrix import ROWS, TOLERANCE, estimate_row

    path = Path(__file__).resolve().parent.parent / "validation" / "matrix.json"
    measured = {r["id"]: r["components"] for r in json.loads(path.read_text())["rows"]}
    for row in ROWS:
        est = estimate_row(row)
        for name, comp in measured[row["id"]].items():
            if name in ("parameters", "gradients", "optimizer"):
                assert est[name] == comp["measured"], (row["id"], name)
            else:
                err = abs(est[name] - comp["measured"]) / comp["measured"]
                assert err <= TOLERANCE["peak"], (row["id"], name, err)


def test_checkpointed_eager_layer_peaks_are_exact_on_the_measured_rows() -> None:
    """The rows whose forward/backward peak is inside a checkpointed or eager layer match the
    measured bytes to within 256 B: Adam's step counters (4 B per parameter tensor, which the CPU
    count holds and the phase estimates leave out) and a few scalars."""
    import json
    from pathlib import Path

    from vrammath.measure.matrix import ROWS, estimate_row

    path = Path(__file__).resolve().parent.parent / "validation" / "matrix.json"
    measured = {r["id"]: r["components"] for r in json.loads(path.read_text())["rows"]}
    inside = (
        "small-gqa/b4/s512/autocast-bf16/eager/rc-full",
        "small-gqa/b4/s512/fp32/eager/rc-full",
        "gpt-tanh/b1/s512/fp32/eager/rc-full",
        "small-tied-mqa/b4/s512/bf16/eager/rc-none",
    )
    for row in ROWS:
        if not row["id"].startswith(inside):
            continue
        est = estimate_row(row)
        for phase in ("forward_peak", "backward_peak"):
            gap = measured[row["id"]][phase]["measured"] - est[phase]
            assert 0 <= gap <= 256, (row["id"], phase, gap)
