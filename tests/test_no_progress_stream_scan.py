"""no_progress's per-delta sentence scan (``stream_repeats``): the same sentences counted
however the answer is split into deltas, and a delta taken as whole pieces -- not character
by character (issue 23: it runs on every delta of every streamed answer)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from support.detectors import Feed

from loopwarden import ModelRequest
from loopwarden.engine.streaming import ModelDelta
from loopwarden.plugins.no_progress import NoProgress, NoProgressSettings
from loopwarden.verdicts import Stop

ENDS = "。！？!?.;；\n"
MAX_CHARS = 400  # the plugin's cap on one sentence's length


def oracle(text: str, min_chars: int) -> list[str]:
    """The counted sentences of ``text`` (the per-character rule, as documented)."""
    out: list[str] = []
    buf: list[str] = []
    for ch in text:
        buf.append(ch)
        if ch not in ENDS and len(buf) < MAX_CHARS:
            continue
        sentence = "".join(buf).strip().casefold()
        buf.clear()
        if len(sentence) >= min_chars:
            out.append(sentence)
    return out


def feed_deltas(pieces: list[str], **settings: Any) -> tuple[Feed, Stop | None]:
    f = Feed(NoProgress(NoProgressSettings(**settings)))
    request = ModelRequest(messages=[], tools=[], step=0)
    parts: list[str] = []
    for i, piece in enumerate(pieces):
        parts.append(piece)
        v = f.plugin.on_model_delta(
            run=f.run, request=request, delta=ModelDelta(piece, i, i + 1, parts)
        )
        if v is not None:
            assert isinstance(v, Stop)
            return f, v
    return f, None


def split(text: str, rng: random.Random) -> list[str]:
    pieces, i = [], 0
    while i < len(text):
        n = rng.choice([1, 2, 3, 5, 8, 13, 64, 500])
        pieces.append(text[i : i + n])
        i += n
    return pieces


WORDS = ["Checking", "order", "88231", "again", "查询订单", "物流", "OK", "x" * 450, " ", "  "]


@pytest.mark.parametrize("seed", range(40))
def test_the_same_sentences_are_counted_however_the_answer_is_split(seed: int) -> None:
    rng = random.Random(seed)
    text = "".join(
        rng.choice(WORDS) + (rng.choice(ENDS) if rng.random() < 0.4 else " ")
        for _ in range(rng.randint(1, 60))
    )
    f, stop = feed_deltas(split(text, rng), stream_repeats=None if seed % 2 else 10**6)
    if seed % 2:  # off: nothing is read
        assert stop is None and f.plugin.state(f.run).echo is None
        return
    counts = f.plugin.state(f.run).echo.counts
    expected: dict[str, int] = {}
    for sentence in oracle(text, min_chars=6):
        if sentence in expected or len(expected) < 256:
            expected[sentence] = expected.get(sentence, 0) + 1
    assert stop is None and counts == expected


def test_the_stop_comes_at_the_repeat_that_reaches_the_limit() -> None:
    text = "Let me check that order. " * 3 + "Let me check that order. trailing"
    pieces = split(text, random.Random(7))
    _, stop = feed_deltas(pieces, stream_repeats=4)
    assert stop is not None and stop.evidence["count"] == 4
    assert stop.evidence["signature"] == "let me check that order."


def test_a_sentence_longer_than_the_cap_is_counted_in_pieces_of_the_cap() -> None:
    f, _ = feed_deltas(["y" * 999], stream_repeats=10)
    echo = f.plugin.state(f.run).echo
    assert echo.counts == {"y" * 400: 2} and echo.size == 199


def test_a_delta_is_taken_in_pieces_not_character_by_character() -> None:
    """A delta without a sentence end is kept as one piece (one append, one join later)."""
    f, _ = feed_deltas(["Checking the order ", "and its delivery "], stream_repeats=4)
    echo = f.plugin.state(f.run).echo
    assert echo.buf == ["Checking the order ", "and its delivery "]
