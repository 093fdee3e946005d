"""Bad input by class: a value of the wrong type anywhere a user can put one is refused with
:class:`InputError` naming the field, never a bare ``TypeError`` (issue 22, class 2).

Each class has a hypothesis strategy, so siblings of the cases that were found are tried too.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vrammath as vm
from vrammath.answers.formulas import FORMULA_OPTIONS, FORMULAS
from vrammath.answers.plan import candidates
from vrammath.cli import main
from vrammath.compose.setup import Setup
from vrammath.notation.errors import InputError
from vrammath.notation.fields import options
from vrammath.serve.estimate import Serve

#: JSON values that are not what any field expects: containers, null, booleans, odd numbers
ODD_JSON = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.integers(-1000, 1000), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(-1000, 1000), max_size=2),
)
#: Python values a caller might pass in by mistake
ODD_PY = st.one_of(ODD_JSON, st.tuples(st.integers()), st.frozensets(st.integers(), max_size=2))


@settings(max_examples=40)
@given(ODD_PY)
def test_a_model_type_of_another_type_is_refused_by_name(model_type: Any) -> None:
    with pytest.raises(InputError, match="^model_type: "):
        vm.from_hf_config({"model_type": model_type, "hidden_size": 64})


@settings(max_examples=40)
@given(ODD_PY.filter(lambda v: not isinstance(v, str)))
def test_a_preset_name_of_another_type_is_refused_by_name(name: Any) -> None:
    with pytest.raises(InputError, match="^model: "):
        vm.load_model(name)
    with pytest.raises(InputError, match="^model: "):
        vm.raw_config(name)


SETUP_INTS = [o.name for o in options(Setup) if o.low is not None]
SERVE_INTS = [o.name for o in options(Serve) if o.low is not None]


@settings(max_examples=60)
@given(st.sampled_from(SETUP_INTS), ODD_PY)
def test_a_training_count_of_another_type_is_refused_by_name(name: str, value: Any) -> None:
    opt = next(o for o in options(Setup) if o.name == name)
    if (value is None and opt.optional) or (isinstance(value, int) and not isinstance(value, bool)):
        return  # None is this field's "none"; ints are checked by their bounds elsewhere
    with pytest.raises(InputError, match=f"^{name}: "):
        vm.estimate(Setup(vm.load_model("llama-7b"), **{name: value}))


@settings(max_examples=60)
@given(st.sampled_from(SERVE_INTS), ODD_PY)
def test_a_serving_count_of_another_type_is_refused_by_name(name: str, value: Any) -> None:
    opt = next(o for o in options(Serve) if o.name == name)
    if (value is None and opt.optional) or (isinstance(value, int) and not isinstance(value, bool)):
        return
    with pytest.raises(InputError, match=f"^{name}: "):
        vm.serve(Serve(vm.load_model("llama-7b"), **{name: value}))


@pytest.mark.parametrize("name", ["seq_len", "micro_batch", "gpus", "tp"])
def test_none_for_a_count_is_refused_at_the_setup(name: str) -> None:
    with pytest.raises(InputError, match=f"^{name}: must be an integer from 1 to "):
        Setup(vm.load_model("llama-7b"), **{name: None})


@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.sampled_from(["estimate", "serve", "fit", "formula"]),
    ODD_JSON.filter(lambda v: not isinstance(v, str)),
)
def test_the_cli_refuses_a_model_type_of_another_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, model_type: Any
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": model_type, "hidden_size": 64}))
    argv = {
        "estimate": ["estimate", str(config)],
        "serve": ["serve", str(config)],
        "fit": ["fit", str(config), "--gpu", "A100-80GB"],
        "formula": ["formula", "params", "--model", str(config)],
    }[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "model_type: " in err
    assert "Traceback" not in err


def test_sweep_without_numpy_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_numpy(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "numpy" or name.startswith("numpy."):
            raise ModuleNotFoundError("No module named 'numpy'")
        return real_import(name, *args, **kwargs)

    est = vm.estimate(Setup(vm.load_model("llama-7b")))
    monkeypatch.setattr(builtins, "__import__", no_numpy)
    with pytest.raises(InputError, match="'numpy' extra"):
        vm.sweep(est, {})


# --- class 3: valid input refused -----------------------------------------------------------


@settings(max_examples=10, deadline=None)
@given(
    st.one_of(
        st.fixed_dictionaries({"capacity_factor": st.sampled_from([1.0, 1.25, 2.0])}),
        st.fixed_dictionaries({"imbalance": st.sampled_from([1.0, 1.5, 3.0])}),
    ),
    st.sampled_from(["none", "selective"]),
)
def test_fit_answers_what_estimate_answers(routing: dict[str, float], recompute: str) -> None:
    # the plan skips the variants the path refuses (full recomputation on the Korthikanti MoE
    # path) instead of refusing the user's own setup
    setup = Setup(
        vm.load_model("mixtral-8x7b"),
        activation_model="korthikanti",
        recompute=recompute,
        ep=8,
        gpus=8,
        gpu="H100-80GB",
        **routing,
    )
    given_bytes = vm.estimate(setup).gpu_bytes
    answer = vm.fit(setup)
    assert answer.given.gpu_bytes == given_bytes
    assert answer.plan.setup is not None
    assert all("full" not in tried.label for tried in answer.plan.tried)


@settings(max_examples=8, deadline=None)
@given(st.integers(min_value=0, max_value=200))
def test_first_k_dense_past_the_layers_is_an_all_dense_model(extra: int) -> None:
    # transformers builds a MoE block only where layer_idx >= first_k_dense_replace
    cfg = dict(vm.raw_config("deepseek-v3"), num_hidden_layers=4)
    past = vm.from_hf_config({**cfg, "first_k_dense_replace": 4 + extra}, "past")
    at = vm.from_hf_config({**cfg, "first_k_dense_replace": 4}, "at")
    assert past.experts is not None
    assert past.experts.layers == ()
    assert vm.param_count(past) == vm.param_count(at)


# --- class 5: errors name the field the user set ----------------------------------------------


@settings(max_examples=20, deadline=None)
@given(
    st.sampled_from(["--capacity-factor", "--imbalance"]),
    st.floats(min_value=1024.001, max_value=1e308, allow_infinity=False),
)
def test_a_huge_ratio_is_refused_by_its_own_name(flag: str, value: float) -> None:
    argv = ["estimate", "mixtral-8x7b", "--activations", "korthikanti", "--ep", "8", "--gpus", "8"]
    assert main([*argv, flag, repr(value)]) == 2


@pytest.mark.parametrize("flag", ["--capacity-factor", "--imbalance"])
def test_the_ratio_message_names_the_ratio(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "mixtral-8x7b", "--activations", "korthikanti", "--ep", "8", "--gpus", "8"]
    assert main([*argv, flag, "1e300"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vrammath: error: {flag[2:].replace('-', '_')}: must be a number")


@pytest.mark.parametrize("model", ["deepseek-v3", "gpt2"])
def test_formula_blames_the_default_targets_not_a_typed_value(
    model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["formula", "lora", "--model", model]) == 2
    assert "q,v (the default) are not projections of" in capsys.readouterr().err


# --- class 6: ASCII spellings only ------------------------------------------------------------

#: characters str.isdigit() or float() take that are not ASCII digits: Arabic-Indic, fullwidth,
#: superscripts, Devanagari
NON_ASCII_DIGITS = st.text(
    alphabet=st.sampled_from("٠١٢٣٤٥٦٧٨٩０１２３４５６７８９²³¹०१२३"), min_size=1, max_size=4
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.sampled_from(["--batch", "--seq", "--gpus", "--tp"]), NON_ASCII_DIGITS)
def test_non_ascii_digits_are_refused_naming_the_flag(
    capsys: pytest.CaptureFixture[str], flag: str, text: str
) -> None:
    assert main(["estimate", "llama-7b", flag, text]) == 2
    err = capsys.readouterr().err
    assert f"{flag[2:]}: must be an integer from" in err
    assert "invalid" not in err


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["full_ſhard", "ſhard_grad_op", "no_ſhard", "FULL_SHARD\u0131"]))
def test_zero_takes_ascii_strategy_names_only(text: str) -> None:
    with pytest.raises(InputError, match="^zero: "):
        Setup(vm.load_model("llama-7b"), zero=text)  # type: ignore[arg-type]


# --- class 4: a flag that changes nothing is refused -------------------------------------------

FLAG_VALUES = {
    "recipe": ("--recipe", "fp32"),
    "optimizer": ("--optimizer", "sgd"),
    "implementation": ("--impl", "fused"),
    "stage": ("--stage", "2"),
    "attention": ("--attention", "eager"),
    "lora_targets": ("--lora-targets", "all-linear"),
    "quant": ("--quant", "int8"),
}


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(FORMULAS), st.sampled_from(sorted(FLAG_VALUES)))
def test_formula_refuses_an_option_its_term_does_not_read(
    capsys: pytest.CaptureFixture[str], term: str, option: str
) -> None:
    flag, value = FLAG_VALUES[option]
    code = main(["formula", term, flag, value])
    err = capsys.readouterr().err
    if option in FORMULA_OPTIONS[term]:
        assert code == 0, err
    else:
        assert code == 2
        assert f"{flag[2:]}: is not read by formula {term}" in err


def test_formula_options_change_what_they_claim_to_read() -> None:
    # each option a term reads changes its text for some value: the table is not over-wide
    others = {"recipe": ("fp32", "bf16-pure"), "optimizer": ("sgd", "adam8bit")}

    def text(*argv: str) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            main(["formula", *argv])
        return out.getvalue()

    for term, names in FORMULA_OPTIONS.items():
        base = text(term)
        for name in names:
            flag, value = FLAG_VALUES[name]
            values = others.get(name, (value,))
            assert any(text(term, flag, v) != base for v in values), (term, flag)


def test_serve_refuses_a_block_without_paging(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "llama-7b", "--no-paging", "--block", "32"]) == 2
    assert "block: is not read with --no-paging" in capsys.readouterr().err
    assert main(["serve", "llama-7b", "--no-paging"]) == 0


def test_imbalance_is_refused_beside_a_capacity_factor() -> None:
    kw = {"activation_model": "korthikanti", "ep": 8, "gpus": 8, "capacity_factor": 1.25}
    with pytest.raises(InputError, match="^imbalance: is not read with --capacity-factor"):
        Setup(vm.load_model("mixtral-8x7b"), imbalance=2.0, **kw)
    Setup(vm.load_model("mixtral-8x7b"), **kw)


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["llama-7b", "gpt2", "qwen2-7b"]), st.integers(2, 64))
def test_shard_layout_without_sharding_is_refused(model: str, gpus: int) -> None:
    spec = vm.load_model(model)
    with pytest.raises(InputError, match="^shard: is read only where ZeRO/FSDP shards"):
        Setup(spec, shard="dim0", gpus=gpus, zero=0)
    with pytest.raises(InputError, match="^shard: is read only where states are sharded over"):
        Setup(spec, shard="dim0", gpus=1, zero=3)
    setup = Setup(spec, shard="dim0", gpus=gpus, zero=3)
    # the plan still weighs plain data parallelism (unsharded, the layout is flat)
    assert any(c.zero == 0 and c.shard == "flat" for c in candidates(setup))


@settings(max_examples=20, deadline=None)
@given(
    st.sampled_from(
        [
            {"activation_model": "korthikanti"},
            {"tp": 8, "sp": True},
            {"pp": 2},
            {"recompute": "selective", "activation_model": "korthikanti"},
        ]
    )
)
def test_cpu_kernels_on_the_korthikanti_path_are_refused(megatron: dict[str, Any]) -> None:
    spec = vm.load_model("gpt-175b")
    with pytest.raises(InputError, match="^device: is read only by the HF-exact"):
        Setup(spec, device="cpu", **megatron)
    assert Setup(spec, **megatron).activation_formula == "korthikanti"
