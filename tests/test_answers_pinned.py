"""Each public answer against a number worked out by hand from published facts.

Every expected value below is arithmetic on literals: model sizes from the published configs,
GPU capacities from ``conf/gpus.toml`` (nvidia-smi's MiB), figures quoted from papers. No
expected value comes from another vrammath call.

Not repeated here, already pinned to hand-computed literals elsewhere:
``kv_cache_bytes`` (test_inference.py::test_paged_last_block_and_window),
``serving_weight_bytes`` (test_inference.py::test_quantized_serving_formats_quantize_the_experts),
``exact_bytes`` (test_budget.py::test_text_is_never_parsed), ``largest``
(test_inverse.py::test_symbol_names_are_looked_up, ::test_ceiling_is_smoothed_then_verified).
``ep_state_bytes`` only has a hand-computed difference (test_moe.py::test_expert_parallel_states),
so it is pinned with ``layout_memory`` below. ``budget`` (only its host side is a literal, in
test_budget.py::test_node_presets) and ``sensitivities`` (only an elasticity of -1 that no model
fact enters, test_sweep.py) get a byte-valued pin here.
"""

from __future__ import annotations

import math

import numpy as np

import vrammath as vm
from vrammath.notation.symbols import K, N_d, P

# LLaMA-7B (huggyllama/llama-7b config): hidden 4096, intermediate 11008, 32 layers, 32 heads
# (no GQA, head_dim 128), vocab 32000, untied head. One decoder layer: q, k, v, o + gate, up,
# down + two RMSNorms.
LAYER_7B = 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096  # 202,383,360
P_7B = 32 * LAYER_7B + 2 * 32000 * 4096 + 4096  # + embedding, lm_head, final norm
# A100: nvidia-smi memory.total 81920 MiB / 40960 MiB (conf/gpus.toml).
A100_80GB = 81920 * 2**20  # 85,899,345,920
A100_40GB = 40960 * 2**20  # 42,949,672,960
RESERVE = 2**30  # vrammath.budget's default reserve for CUDA context and workspaces (1 GiB)

# Pipeline of 2 stages (Megatron): stage 0 = embedding + 16 layers, stage 1 = 16 layers + final
# norm + lm_head. Each rank is charged the fuller stage (the last, by one norm).
P_STAGE = 16 * LAYER_7B + 4096 + 32000 * 4096  # 3,369,209,856


def korthikanti_first_stage(s: int, b: int = 1) -> int:
    """Korthikanti et al. 2022 (arXiv:2205.05198), Table 2 / Eq. 5, no tensor parallelism:
    sbh(34 + 5as/h) bytes per layer, L layers on the first 1F1B stage, plus the embedding
    dropout mask sbhp (1 byte, p = 2 micro-batches in flight)."""
    h, a, L, p = 4096, 32, 32, 2
    return L * (34 * s * b * h + 5 * a * s * s * b) + s * b * h * p


def zero1_pp2_setup(gpu: str) -> vm.Setup:
    return vm.Setup(
        vm.load_model("llama-7b"),
        zero=1,
        gpus=4,
        pp=2,
        implementation="fused",  # fused AdamW: no optimizer-step temporaries
        activation_model="korthikanti",
        gpu=gpu,
    )


# Forward peak of ZeRO-1 over 4 ranks with fused AdamW: bf16 weights (2 B) and the 1/4 shard of
# fp32 master + moments (12 B); gradients are None until backward (zero_grad(set_to_none=True)).
ZERO1_FIXED = 2 * P_STAGE + 12 * P_STAGE // 4  # 16,846,049,280


def test_published_llama_7b_count() -> None:
    assert P_7B == 6_738_415_616  # LLaMA-7B's parameter count
    assert LAYER_7B == 202_383_360


def test_budget_usable_is_capacity_less_headroom_and_reserve() -> None:
    assert vm.budget("A100-80GB").usable == A100_80GB - RESERVE == 84_825_604_096
    # 10 % headroom: 0.9 x 85,899,345,920 = 77,309,411,328 exactly, then the 1 GiB reserve
    assert vm.budget("A100-80GB", headroom=0.1).usable == 77_309_411_328 - RESERVE


def test_fewest_gpus_zero3_bound_by_16_bytes_per_parameter() -> None:
    est = vm.estimate(
        vm.Setup(vm.load_model("llama-7b"), zero=3, gpus=8, implementation="fused", seq_len=128)
    )
    sol = vm.fewest_gpus(est, vm.budget(15 * 10**9, reserve_bytes=0))
    # 16 B/param sharded: 7 ranks hold 16 x ceil(P/7) = 15.40 GB > 15 GB before anything else
    assert 16 * math.ceil(P_7B / 7) > 15 * 10**9
    # 8 ranks: 16P/8 (P divides by 8) plus ZeRO-3's backward in flight: two gathered bf16
    # layers (current + prefetch) and one bf16 layer of gradients for reduce-scatter
    assert (sol.value, sol.neighbour) == (8, 7)
    assert sol.bytes == 16 * P_7B // 8 + 3 * 2 * LAYER_7B == 14_691_131_392


def test_largest_micro_batch_korthikanti_first_stage() -> None:
    est = vm.estimate(zero1_pp2_setup("A100-80GB"))
    sol = vm.largest_micro_batch(est)
    per_sample = korthikanti_first_stage(2048)
    assert per_sample == 30_618_419_200
    usable = A100_80GB - RESERVE
    assert ZERO1_FIXED + 2 * per_sample <= usable < ZERO1_FIXED + 3 * per_sample
    assert sol.value == 2
    assert sol.bytes == ZERO1_FIXED + 2 * per_sample == 78_082_887_680
    assert sol.neighbour_bytes == ZERO1_FIXED + 3 * per_sample


def test_longest_sequence_korthikanti_first_stage() -> None:
    sol = vm.longest_sequence(vm.estimate(zero1_pp2_setup("A100-80GB")))
    # 5120 s^2 + 4,464,640 s <= usable - fixed: the positive root of the quadratic
    quad, lin = 32 * 5 * 32, 32 * 34 * 4096 + 2 * 4096
    room = A100_80GB - RESERVE - ZERO1_FIXED
    s = (math.isqrt(lin * lin + 4 * quad * room) - lin) // (2 * quad)
    assert ZERO1_FIXED + korthikanti_first_stage(s) <= A100_80GB - RESERVE
    assert ZERO1_FIXED + korthikanti_first_stage(s + 1) > A100_80GB - RESERVE
    assert sol.value == s == 3233
    assert sol.bytes == ZERO1_FIXED + korthikanti_first_stage(3233)


def test_fit_on_a100_40gb() -> None:
    answer = vm.fit(zero1_pp2_setup("A100-40GB"))
    usable = A100_40GB - RESERVE  # 41,875,931,136
    given = ZERO1_FIXED + korthikanti_first_stage(2048)
    assert answer.given.gpu_bytes == given == 47_464_468_480 > usable
    assert not answer.fits
    assert answer.batch.status == "none-fits"  # even b = 1 is the 47.46 GB above
    assert answer.sequence.value == 1817
    assert ZERO1_FIXED + korthikanti_first_stage(1817) <= usable
    assert ZERO1_FIXED + korthikanti_first_stage(1818) > usable
    # fewest ranks: 2P + 12P/N_d + activations <= usable (12P / 4.52 GB of room: 8.95 -> 9);
    # only the count is pinned: 9 does not divide P, and vrammath rounds each shard's bytes,
    # not its elements (ceil(12P/9) B, not 12 x ceil(P/9) B: 4 bytes less)
    room = usable - 2 * P_STAGE - korthikanti_first_stage(2048)
    assert math.ceil(12 * P_STAGE / room) == 9
    assert answer.gpus.value == 9


def test_cheapest_fit_zero0_misses_zero1_fits() -> None:
    setup = vm.Setup(
        vm.load_model("llama-7b"), gpus=8, implementation="fused", seq_len=512, gpu="A100-80GB"
    )
    plan = vm.cheapest_fit(setup)
    # ZeRO-0: the 16 B/param states (107.8 GB) and, in the step, the masters' fp32 gradients
    # for the bf16 ones (+2 B/param) exceed 84.8 GB usable
    assert [(t.label, t.bytes, t.fits) for t in plan.tried] == [
        ("ZeRO-0", 18 * P_7B, False),
        ("ZeRO-1", 37_061_285_888, True),
    ]
    # ZeRO-1 at the optimizer step: bf16 weights and gradients whole (4P), fp32 master and
    # moments over 8 ranks (12P/8): 5.5 bytes per parameter
    assert plan.label == "ZeRO-1"
    assert plan.estimate is not None
    assert plan.estimate.gpu_bytes == 4 * P_7B + 12 * P_7B // 8 == 37_061_285_888


def test_smallest_ranks_for_zero1_states_in_40_gb() -> None:
    sol = vm.smallest([4 * P, 12 * P / N_d], {P: P_7B}, N_d, 40 * 10**9)
    # 4P = 26.95 GB leaves 13.05 GB for 12P/N_d = 80.86 GB / N_d: N_d >= 6.2
    assert sol.value == 7
    assert sol.bytes == 4 * P_7B + math.ceil(12 * P_7B / 7) == 38_505_232_092
    assert sol.neighbour == 6
    assert sol.neighbour_bytes == 6 * P_7B == 40_430_493_696


def test_sweep_zero1_over_data_parallel_ranks() -> None:
    est = vm.estimate(
        vm.Setup(vm.load_model("llama-7b"), zero=1, gpus=8, implementation="fused", seq_len=512)
    )
    out = vm.sweep(est, {"N_d": np.array([1, 2, 4, 8, 64])})
    # ZeRO paper's P_os: (2 + 2)P + 12P/N_d at the optimizer step; every N_d here divides P
    expected = [4 * P_7B + 12 * P_7B // n for n in (1, 2, 4, 8, 64)]
    assert expected == [16 * P_7B, 10 * P_7B, 7 * P_7B, 37_061_285_888, 28_217_115_392]
    assert out.tolist() == expected


def test_sensitivities_of_zero1_to_data_parallel_ranks() -> None:
    est = vm.estimate(
        vm.Setup(vm.load_model("llama-7b"), zero=1, gpus=8, implementation="fused", seq_len=512)
    )
    rows = {x.component: x for x in vm.sensitivities(est, ["N_d"])}
    total, moments = rows["total"], rows["optimizer"]
    # total 4P + 12P/N_d: d/dN_d = -12P/N_d^2 at N_d = 8; doubling to 16 frees 12P/16
    assert total.rate == -12 * P_7B / 64 == -1_263_452_928
    assert total.step_saving == 12 * P_7B // 8 - 12 * P_7B // 16 == 5_053_811_712
    assert abs(total.elasticity - (-1.5 / 5.5)) < 1e-12  # 8 x (-12P/64) / 5.5P = -3/11
    # the two fp32 moments, 8P/N_d
    assert moments.rate == -8 * P_7B / 64 == -842_301_952
    assert moments.step_saving == P_7B // 2


def test_formula_exprs_zero_reproduces_zero_paper_figure_1() -> None:
    # Rajbhandari et al. 2020 (arXiv:1910.02054), Figure 1: a 7.5B model, N_d = 64, K = 12
    # (mixed-precision Adam): 120 GB, 31.4 GB, 16.6 GB and 1.9 GB per GPU for stages 0-3.
    spec = vm.load_model("llama-7b")
    values = {P: 7_500_000_000, K: 12, N_d: 64}
    got = []
    for stage in range(4):
        (expr,) = vm.formula_exprs("zero", spec, stage=stage).values()
        got.append(int(expr.subs(values)))
    assert got == [120 * 10**9, 31_406_250_000, 16_640_625_000, 1_875_000_000]
    assert [round(x / 10**9, 1) for x in got] == [120.0, 31.4, 16.6, 1.9]


def test_serve_llama_7b_on_a100_80gb() -> None:
    est = vm.serve(vm.Serve(vm.load_model("llama-7b"), context=2048, batch=8, gpu="A100-80GB"))
    per_token = 2 * 32 * 32 * 128 * 2  # K and V x 32 layers x 32 heads x 128 dims x bf16
    assert est.per_token_bytes == per_token == 512 * 1024
    assert est.weights_bytes == 2 * P_7B == 13_476_831_232
    assert est.kv_bytes == 8 * 2048 * per_token == 8_589_934_592  # 2048 = 128 blocks of 16
    # vLLM's gpu_memory_utilization 0.9 of 85,899,345,920 bytes, less the weights
    kv_budget = 77_309_411_328 - 2 * P_7B
    assert est.kv_budget_bytes == kv_budget == 63_832_580_096
    assert est.max_batch() == kv_budget // (2048 * per_token) == 59  # 1 GiB per sequence
    # 8 sequences: whole blocks of 16 tokens, 951 blocks = 15216 tokens each
    assert kv_budget // (8 * 16 * per_token) * 16 == 15216
    assert est.max_context() == 15216


def test_layout_memory_and_ep_state_bytes_of_mixtral() -> None:
    # Mixtral-8x7B (arXiv:2401.04088, mistralai/Mixtral-8x7B-v0.1 config): hidden 4096, 32
    # layers, 32 heads of 128, 8 KV heads, 8 experts of intermediate 14336, vocab 32000.
    experts = 32 * 8 * 3 * 14336 * 4096
    attention = 32 * (2 * 4096 * 4096 + 2 * 1024 * 4096)
    rest = 2 * 32000 * 4096 + (2 * 32 + 1) * 4096 + 32 * 8 * 4096  # embed, head, norms, routers
    dense = attention + rest
    assert dense + experts == 46_702_792_704  # the published 46.7B
    # 16 GPUs, EP 8, ZeRO-1: a rank holds the dense part and 1 of 8 experts per layer (bf16
    # weights and gradients); master and moments shard dense over 16 ranks, experts over 2
    held = dense + experts // 8
    shard = dense // 16 + experts // 8 // 2
    states = {
        "weights": 2 * held,
        "gradients": 2 * held,
        "master": 4 * shard,
        "optimizer": 8 * shard,
    }
    assert states["weights"] == 14_485_561_344
    mem = vm.layout_memory(vm.load_model("mixtral-8x7b"), vm.Layout(16, ep=8, zero=1))
    assert mem.states == states
    assert vm.ep_state_bytes(vm.load_model("mixtral-8x7b"), zero=1, gpus=16, ep=8) == states
