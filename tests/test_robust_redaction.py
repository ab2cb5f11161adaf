"""The redactor runs inside every run (and on the event loop under ``arun``): it must take
linear time on any text, and keep its masking semantics exactly."""

from __future__ import annotations

import re
import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from loopwarden.redaction import DEFAULT_REDACT_KEYS, MASK, Redactor

MB = 1_000_000


def _old_pairs(keys: tuple[str, ...] = DEFAULT_REDACT_KEYS, mask: str = MASK) -> re.Pattern[str]:
    """The key=value pattern as it was before it was made linear: the reference semantics."""
    names = "|".join(
        sorted((re.escape(k).replace("_", "[_-]") for k in keys), key=len, reverse=True)
    )
    return re.compile(
        r"""(?i)(["']?[\w-]*?(?<![a-z0-9])(?:""" + names + r""")["']?\s*[:=]\s*)"""
        r"""(?!""" + re.escape(mask) + r""")"""
        r"""("(?:[^"\\]|\\.)*"|'[^']*'"""
        r"""|(?:(?:bearer|basic|digest|token|apikey)[ \t]+)?[^\s,;&}\]]+)"""
    )


_OLD = _old_pairs()
# characters that matter to the pattern: word characters, separators, quotes, key names
_PIECES = st.sampled_from(
    [
        "a",
        "x",
        "K",
        "中",
        "_",
        "-",
        " ",
        "\t",
        "=",
        ":",
        '"',
        "'",
        "\\",
        ",",
        ";",
        "&",
        "}",
        "]",
        "token",
        "api_key",
        "api-key",
        "Authorization",
        "password",
        "secret",
        "my_",
        "bearer ",
        "sk-",
        "[REDACTED]",
        "tokens",
        "max_tokens",
        "x_api_key",
        "2",
    ]
)


@settings(max_examples=600, deadline=None)
@given(st.lists(_PIECES, max_size=24).map("".join))
def test_pairs_mask_exactly_as_before(text: str) -> None:
    red = Redactor(patterns=())
    old = _OLD.sub(red._mask_pair, text)
    if '\\"' in old:  # then the pairs one JSON level down (\"key\": \"v\") are masked too
        assert red._escaped is not None
        old = red._escaped.sub(red._mask_escaped_pair, old)
    assert red.text(text) == old


def _seconds(fn: object, arg: str, limit: float = 60.0) -> float:
    """Seconds ``fn(arg)`` took; fails (instead of hanging) past ``limit``."""
    took: list[float] = []

    def work() -> None:
        t = time.perf_counter()
        fn(arg)  # type: ignore[operator]
        took.append(time.perf_counter() - t)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(limit)
    assert took, f"did not finish within {limit} s"
    return took[0]


def test_megabyte_inputs_take_linear_time() -> None:
    """One long word used to be quadratic (15 s at 40k characters).  Each megabyte input is
    compared with a linear baseline on the same input (a regex scan of every character):
    a quadratic redactor is ~10^5 times that baseline at a megabyte, a linear one a few
    times."""
    red = Redactor(literals=["sk-literal-secret"])
    scan = re.compile(r"(?s).").findall  # touches every character: linear by construction
    inputs = {
        "one word": "a" * MB,
        "dashes": "-" * MB,
        "underscored": "a_" * (MB // 2),
        "keys without values": "token=" * (MB // 6),
        "unterminated quotes": 'token="' * (MB // 7),
        "bearer runs": "bearer " * (MB // 7),
        "mixed": ("x_api_key: " + "z" * 200 + " ") * (MB // 212),
    }
    for label, text in inputs.items():
        base = min(_seconds(scan, text) for _ in range(2))
        took = _seconds(red.text, text)
        assert took < 50 * base + 0.5, (label, took, base)


def test_a_megabyte_answer_is_still_redacted() -> None:
    red = Redactor()
    text = "a" * MB + " api_key=sk-abcdefghijklmnop " + "b" * MB
    out = red.text(text)
    assert "sk-abcdefghijklmnop" not in out
    assert out.count(MASK) == 1
    assert len(out) < len(text)
