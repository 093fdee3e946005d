"""Setup and Serve: one vocabulary, field metadata declared once, bounds and cross-field rules."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, cast

import pytest

from vrammath.answers.report import estimate_dict
from vrammath.cli import build_parser
from vrammath.compose.estimate import estimate
from vrammath.compose.setup import Setup, setup_warnings
from vrammath.model.presets import load_model
from vrammath.notation import vocab
from vrammath.notation.errors import InputError
from vrammath.notation.fields import MAX_COUNT, MAX_TOKENS, options
from vrammath.notation.vocab import KV_DTYPES, SERVE_WEIGHTS
from vrammath.serve.estimate import Serve, serve_warnings
from vrammath.terms.lora.quant import QUANTS
from vrammath.terms.states import IMPLEMENTATIONS, OPTIMIZERS, RECIPES

LLAMA = load_model("llama-7b")


def test_tuples_are_the_literals() -> None:
    assert vocab.RECIPE_NAMES == typing.get_args(vocab.Recipe) == tuple(RECIPES)
    assert vocab.OPTIMIZERS == OPTIMIZERS
    assert vocab.IMPLEMENTATIONS == IMPLEMENTATIONS
    assert vocab.QUANTS == QUANTS
    assert vocab.SERVE_WEIGHTS == SERVE_WEIGHTS
    assert vocab.KV_DTYPES == KV_DTYPES
    assert set(vocab.PRECISION_OF) == set(vocab.RECIPE_NAMES)
    assert set(vocab.PRECISION_OF.values()) <= set(vocab.PRECISIONS)


def test_every_field_is_declared_once_and_drives_cli_and_json() -> None:
    declared = [o.name for o in options(Setup)]
    # all but the model and DeepSpeed ZeRO-3's gathering keys, which only its config sets
    # (the estimate's engine line prints them)
    fields = [f.name for f in dataclasses.fields(Setup)][1:]
    assert declared == [name for name in fields if name != "stage3"]
    assert len(declared) == 36
    parser = build_parser()
    sub: Any = next(a for a in parser._actions if a.dest == "command").choices
    for command, cls in (("estimate", Setup), ("fit", Setup), ("serve", Serve)):
        flags = {s for a in sub[command]._actions for s in a.option_strings}
        for opt in options(cls):
            if opt.flag is not None:
                assert opt.flag in flags, (command, opt.flag)
    data: Any = estimate_dict(estimate(Setup(LLAMA)))
    assert list(data["setup"]) == declared


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"micro_batch": MAX_TOKENS + 1}, "micro_batch: must be an integer from 1 to 16777216"),
        ({"seq_len": 10**400}, "seq_len: must be an integer from 1 to 16777216 (got an integer"),
        ({"gpus": MAX_COUNT + 1}, "gpus: must be an integer from 1 to 1048576"),
        ({"lora_rank": 0}, "lora_rank: must be an integer from 1 to 1048576"),
        ({"micro_batch": True}, "micro_batch: must be an integer"),
        ({"tp": 64}, "tp: must divide the attention heads (32)"),
        ({"tp": 100000}, "tp: must divide the attention heads (32)"),
        ({"tp": 3}, "tp: must divide the attention heads (32)"),
        ({"pp": 1000}, "pp: must be at most the layers (32)"),
        ({"ep": 2, "gpus": 2}, "ep: must be 1 for llama-7b, which has no experts (got 2)"),
        ({"schedule": "interleaved", "chunks": 2}, "schedule: interleaved needs --pp > 1"),
        ({"schedule": "interleaved", "pp": 4}, "chunks: interleaved needs --chunks > 1"),
        ({"schedule": "interleaved", "pp": 8, "chunks": 8}, "chunks: pp x chunks must be at most"),
        ({"chunks": 2}, "chunks: is used only by --schedule interleaved"),
        ({"lora_targets": ("q", "k")}, "lora_targets: needs --lora-rank"),
        ({"lora_dropout": True}, "lora_dropout: needs --lora-rank"),
        ({"quant": "nf4"}, "quant: needs --lora-rank"),
        ({"offload_optimizer": "false"}, "offload_optimizer: must be true or false"),
        ({"recipe": "fp64"}, "recipe: must be one of fp32"),
        ({"gpu": 3}, "gpu: must be a GPU preset name"),
    ],
)
def test_setup_refuses(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as info:
        Setup(LLAMA, **kwargs)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_setup_model_must_be_a_spec() -> None:
    with pytest.raises(InputError, match="model: must be a ModelSpec"):
        Setup(cast(Any, "llama-7b"))


def test_kv_heads_rule() -> None:
    with pytest.raises(InputError, match=r"tp: must divide the KV heads \(8\)"):
        Setup(load_model("llama-2-70b"), tp=16, zero=1)
    assert Setup(load_model("llama-2-70b"), tp=8).tp == 8


def test_autocast_on_gpt2_names_the_recipe() -> None:
    with pytest.raises(InputError, match="^recipe: autocast is not derived for GPT-2"):
        Setup(load_model("gpt2"), recipe="autocast-fp16")
    # Korthikanti's formula has no such restriction
    Setup(load_model("gpt2"), recipe="autocast-fp16", activation_model="korthikanti")


def test_serve_rules() -> None:
    spec = load_model("llama-2-70b")  # 64 heads, 8 KV heads
    assert Serve(spec, tp=16).tp == 16  # KV heads replicated, as vLLM does
    for tp, message in ((3, r"attention heads \(64\)"), (128, r"attention heads \(64\)")):
        with pytest.raises(InputError, match=message):
            Serve(spec, tp=tp)
    with pytest.raises(InputError, match="gpu_util: must be a number in"):
        Serve(spec, gpu_util=cast(Any, "0.5"))
    with pytest.raises(InputError, match="context: must be an integer from 1 to 16777216"):
        Serve(spec, context=2**40)
    with pytest.raises(InputError, match="block: must be an integer from 1"):
        Serve(spec, block=0)


def test_warnings() -> None:
    assert setup_warnings(Setup(LLAMA, seq_len=2048)) == ()
    (line,) = setup_warnings(Setup(LLAMA, seq_len=4096))
    assert line == "seq_len 4096 exceeds the model's max_position_embeddings (2048)"
    assert serve_warnings(Serve(LLAMA, context=2048)) == ()
    assert len(serve_warnings(Serve(LLAMA, context=2049))) == 1


def test_api_mistakes_are_input_errors() -> None:
    from vrammath.model.presets import gpu
    from vrammath.serve.kv_cache import kv_cache_bytes

    with pytest.raises(InputError, match="^gpu: must be one of"):
        gpu(cast(Any, None))
    with pytest.raises(InputError, match="^lora_targets: must be a list"):
        Setup(LLAMA, lora_rank=8, lora_targets=cast(Any, None))
    with pytest.raises(InputError, match="^block: must be a positive integer"):
        kv_cache_bytes(LLAMA, 1, 16, block=0)
