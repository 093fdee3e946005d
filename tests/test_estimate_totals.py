"""Estimate's named totals: states plus gathered layers, and the activations kept for backward."""

from dataclasses import replace

import pytest

from vrammath import Setup, estimate, load_model, param_count

LLAMA7 = load_model("llama-7b")
P7 = param_count(LLAMA7)


def test_states_plus_gathered_without_zero3_is_the_model_states() -> None:
    est = estimate(Setup(LLAMA7, zero=0, gpus=1, seq_len=4096))
    assert est.states_plus_gathered_bytes == est.model_state_bytes == 16 * P7


@pytest.mark.parametrize("gpus", [1, 8, 64])
def test_states_plus_gathered_under_zero3_adds_the_gathered_layers(gpus: int) -> None:
    est = estimate(Setup(LLAMA7, zero=3, gpus=gpus, seq_len=4096))
    # 16 bytes of states per parameter, sharded (the last rank pads), and two llama-7b layers
    # (4 h^2 + 3 h I + 2 h = 202,383,360 parameters each) gathered in bf16
    assert est.states_plus_gathered_bytes == 16 * -(-P7 // gpus) + 2 * 2 * 202_383_360
    assert est.states_plus_gathered_bytes < est.gpu_bytes  # activations come on top


def test_activation_bytes_are_the_kept_activations_and_logits() -> None:
    est = estimate(Setup(LLAMA7, seq_len=4096))
    # the logits upcast to fp32 (4 s V) and the loss's own buffers (32,784 bytes) ride on top
    # of the layers' kept tensors
    logits = 4 * 4096 * 32000 + 32_784
    assert est.activation_bytes - est.component("activations").bytes == logits
    # independent of the data-parallel size: ZeRO shards states, not activations
    z3 = estimate(Setup(LLAMA7, zero=3, gpus=64, seq_len=4096))
    assert z3.activation_bytes == est.activation_bytes


def test_activation_bytes_grow_with_the_micro_batch() -> None:
    one = estimate(Setup(LLAMA7, seq_len=2048))
    two = estimate(replace(one.setup, micro_batch=2))
    assert one.activation_bytes < two.activation_bytes < 2 * one.activation_bytes + 1
