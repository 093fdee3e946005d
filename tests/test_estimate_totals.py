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
    gathered = est.component("gathered").bytes
    assert gathered is not None
    assert gathered > 0
    assert est.states_plus_gathered_bytes == est.model_state_bytes + gathered
    assert est.states_plus_gathered_bytes < est.gpu_bytes  # activations come on top


def test_activation_bytes_are_the_kept_activations_and_logits() -> None:
    est = estimate(Setup(LLAMA7, seq_len=4096))
    kept = [est.component(k).bytes for k in ("activations", "logits_loss")]
    assert est.activation_bytes == sum(b for b in kept if b is not None) > 0
    # independent of the data-parallel size: ZeRO shards states, not activations
    z3 = estimate(Setup(LLAMA7, zero=3, gpus=64, seq_len=4096))
    assert z3.activation_bytes == est.activation_bytes


def test_activation_bytes_grow_with_the_micro_batch() -> None:
    one = estimate(Setup(LLAMA7, seq_len=2048))
    two = estimate(replace(one.setup, micro_batch=2))
    assert one.activation_bytes < two.activation_bytes < 2 * one.activation_bytes + 1
