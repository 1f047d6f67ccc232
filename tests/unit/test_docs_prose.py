"""The user pages read quickly: their prose sentences average at most 20 words.

The measure is the one ``/work/shared/hooks/before-stop`` prints, in Python::

    sed '/^```/,/^```/d; /^ *|/d' FILE | tr '\\n' ' ' | sed 's/[.!?] /&\\n/g' |
        awk 'NF>3{n++; t+=NF} END{printf "%.0f", t/n}'

- Fenced code blocks are left out (from a line starting with three backticks to the next
  such line), and so are table rows (lines starting with ``|``, after any spaces).
- Everything else is prose: the lines are joined with spaces and cut after each ``.``,
  ``!`` or ``?`` followed by a space. Headings and list items are not left out: one without
  a closing period runs on into the next sentence, so a list of fragments counts as one
  long sentence. End an item that is a sentence with a period.
- A piece of three words or fewer (a heading alone, "e.g.") is not a sentence; words are
  what whitespace separates.

The average is asserted unrounded (the hook rounds it). docs/performance.md is measured like
a how-to page, and stays at most 400 lines: the headline, the charts, how to rerun and the
recommended settings, with each benchmark's detail in benchmarks/README.md.
docs/architecture.md explains the design to contributors: its limit is 22, the hook's.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 20
DESIGN_LIMIT = 22
PERFORMANCE_LINES = 400
NOT_HOW_TO = {"architecture.md"}
PAGES = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in NOT_HOW_TO)


def sentences(text: str) -> list[int]:
    """The word count of each prose sentence of a markdown text (the rule above)."""
    kept: list[str] = []
    fenced = False
    for line in text.split("\n"):
        if fenced:
            fenced = not line.startswith("```")
        elif line.startswith("```"):
            fenced = True
        elif not line.lstrip(" ").startswith("|"):
            kept.append(line)
    prose = " ".join(kept)
    counts = (len(piece.split()) for piece in re.split(r"(?<=[.!?] )", prose))
    return [n for n in counts if n > 3]


def words_per_sentence(text: str) -> float:
    """The average words per prose sentence (0 for a text without prose)."""
    counts = sentences(text)
    return sum(counts) / len(counts) if counts else 0.0


def test_the_measure_is_the_hooks() -> None:
    text = (
        "# A heading\n\nOne two three four five. Six seven.\n\n```python\nx = 1. y = 2. z\n```\n"
        "| a | b. c d e f |\n- an item without a period\n- another one. e.g. done\n"
    )
    # "# A heading One two three four five." (8 words, "#" one of them) and "- an item without
    # a period - another one." (9); "Six seven.", "e.g." and "done" are three words or fewer,
    # and the code and the table row are not prose. The hook's pipeline gives the same.
    assert sentences(text) == [8, 9]
    assert words_per_sentence(text) == 8.5


@pytest.mark.parametrize("page", [*PAGES, ROOT / "README.md"], ids=lambda p: p.name)
def test_prose_sentences_average_at_most_20_words(page: Path) -> None:
    average = words_per_sentence(page.read_text())
    assert average <= LIMIT, (
        f"{page.name}: prose sentences average {average:.1f} words, more than {LIMIT}: "
        "split long sentences, and move cost analyses and design reasoning out of how-to pages"
    )


def test_the_architecture_page_averages_at_most_22_words() -> None:
    average = words_per_sentence((ROOT / "docs" / "architecture.md").read_text())
    assert average <= DESIGN_LIMIT, (
        f"architecture.md: prose sentences average {average:.1f} words, more than "
        f"{DESIGN_LIMIT}: split long sentences"
    )


def test_the_performance_page_stays_short() -> None:
    lines = (ROOT / "docs" / "performance.md").read_text().count("\n")
    assert lines <= PERFORMANCE_LINES, (
        f"performance.md has {lines} lines, more than {PERFORMANCE_LINES}: move each "
        "benchmark's method, cells and spread to benchmarks/README.md"
    )


def test_the_pages_are_the_ones_we_think() -> None:
    """A new page is measured; only the design page has a limit of its own."""
    names = {p.name for p in PAGES}
    assert {"liveness.md", "performance.md"} <= names and not names & NOT_HOW_TO
