"""Bounded rendering: what a page shows of a value that may be large (args, results,
metadata, tags, error text), a preview with its size, never the whole of a 50 MB value; the
whole value is a download of its own."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pgq._core import serde

#: Characters of JSON a job's page shows of its args, result or metadata.
PREVIEW_CHARS = 20_000
#: Characters of a job's args in a row of the jobs list.
CELL_CHARS = 90
#: Tags a job's page shows, and the characters of each (what an enqueue accepts now).
PAGE_TAGS, PAGE_TAG_CHARS = 32, 128
#: Tags a row of the jobs list shows, and the characters of each.
ROW_TAGS, ROW_TAG_CHARS = 5, 40
#: Characters of an error's message and of its traceback in the timeline (a worker stores up
#: to 10,000 and 50,000; every error downloads whole).
MESSAGE_CHARS, TRACEBACK_CHARS = 2_000, 6_000
#: The longest key shown (a unique key is at most 1,024 bytes now; older rows may hold more).
KEY_CHARS = 1024
#: Lines of a job's timeline shown: its enqueue and the latest ones.
TIMELINE_EVENTS = 50


@dataclass(frozen=True, slots=True)
class Preview:
    """The start of a value's JSON; ``size`` is the whole value's, in bytes of compact JSON,
    when the text is only its start (None: the text is all of it)."""

    text: str
    size: int | None = None


@dataclass(frozen=True, slots=True)
class Tags:
    """The tags shown (each clipped; ``whole`` says which are whole) and how many are not."""

    shown: list[tuple[str, bool]]
    hidden: int


def json_preview(value: Any, limit: int, *, pretty: bool) -> Preview:
    """The JSON of ``value`` up to ``limit`` characters, encoded only that far (a value of
    any size costs a page the same)."""
    problem = serde.unreadable(value)
    if problem is not None:
        return Preview(f"(not shown: {problem})")
    encoder = json.JSONEncoder(
        ensure_ascii=False,
        default=str,
        indent=2 if pretty else None,
        separators=(",", ": ") if pretty else (", ", ": "),
        sort_keys=pretty,
    )
    chunks: list[str] = []
    length = 0
    # iterencode (not one-shot) yields as it goes: stopping early leaves the rest unencoded.
    for chunk in encoder.iterencode(value):
        chunks.append(chunk)
        length += len(chunk)
        if length > limit:
            text = "".join(chunks)[:limit]
            return Preview(text + " …", whole_size(value))
    return Preview("".join(chunks))


def whole_size(value: Any) -> int:
    """Bytes of ``value``'s compact JSON (about what PostgreSQL stores)."""
    text = json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))
    return len(text.encode("utf-8", "surrogatepass"))


def clip(text: str | None, limit: int) -> str:
    """``text`` up to ``limit`` characters, saying how long it was when clipped."""
    if text is None:
        return ""
    if len(text) <= limit:
        return text
    return f"{text[:limit]} … ({len(text):,} characters in all)"


def tags(values: Sequence[str], count: int, chars: int) -> Tags:
    """The first ``count`` tags, each clipped at ``chars`` characters."""
    shown = [(t if len(t) <= chars else t[:chars] + "…", len(t) <= chars) for t in values[:count]]
    return Tags(shown, max(len(values) - count, 0))
