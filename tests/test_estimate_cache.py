"""A change of the micro-batch or the sequence re-substitutes the composed expressions.

``estimate()`` keeps each setup's rows, labels, notes and phase model per structure (every field
but ``micro_batch`` and ``seq_len``), so the browser's number fields and the solvers' sweeps
evaluate existing expressions instead of building them again. That is exact only while nothing
but ``b`` and ``s`` carries those two fields into a term: checked here by reading the source,
and by comparing a reused composition with a fresh one.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from vrammath import Estimate, Setup, estimate, load_model
from vrammath.compose import estimate as composition

ROOT = Path(__file__).resolve().parent.parent / "vrammath"
#: the only readers of the two fields: the values of b and s, and the trained-context warning
READERS = {
    ("compose/estimate.py", "estimate"),
    ("compose/estimate.py", "_values"),
    ("compose/setup.py", "setup_warnings"),
}


def test_only_b_and_s_carry_the_run_numbers() -> None:
    found = set()
    for path in [
        *ROOT.glob("compose/*.py"),
        *ROOT.glob("terms/**/*.py"),
        *ROOT.glob("model/**/*.py"),
    ]:
        function = ""
        for line in path.read_text(encoding="utf-8").splitlines():
            head = re.match(r"def (\w+)", line)
            function = head.group(1) if head else function
            # an attribute read (a config file's key in quotes, "training.seq_len", is not one)
            if re.search(r"(?<![\"'\w])\w+\.(micro_batch|seq_len)\b", line):
                found.add((str(path.relative_to(ROOT)), function))
    assert found == READERS


def _shown(est: Estimate) -> object:
    return [(c.key, c.label, c.note, c.expr, c.bytes) for c in est.components], est.phases


@settings(max_examples=25, deadline=None)
@given(
    model=st.sampled_from(["gpt2", "llama-7b", "mixtral-8x7b", "gemma-2-9b"]),
    zero=st.integers(0, 3),
    recompute=st.sampled_from(["none", "full"]),
    first=st.tuples(st.integers(1, 8), st.integers(1, 4096)),
    second=st.tuples(st.integers(1, 8), st.integers(1, 4096)),
)
def test_a_reused_composition_equals_a_fresh_one(
    model: str, zero: int, recompute: str, first: tuple[int, int], second: tuple[int, int]
) -> None:
    spec = load_model(model)
    attention = "eager" if model.startswith("gemma") else "sdpa"  # SDPA refuses softcapping
    kw = {"zero": zero, "gpus": 8, "recompute": recompute, "attention": attention}
    estimate(Setup(spec, micro_batch=first[0], seq_len=first[1], **kw))  # composes
    again = estimate(Setup(spec, micro_batch=second[0], seq_len=second[1], **kw))  # reuses
    composition._COMPOSED.clear()
    fresh = estimate(Setup(spec, micro_batch=second[0], seq_len=second[1], **kw))
    assert _shown(again) == _shown(fresh)
    assert again.setup.micro_batch == second[0]
    assert again.setup.seq_len == second[1]
