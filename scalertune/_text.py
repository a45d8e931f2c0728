"""Small text helpers shared by the errors, the summary, the notes and the result file."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

#: Significant digits of the figures shown for reading (notes, trial attributes in the
#: dashboard). Step times vary by more than 0.1% from run to run, so a fifth digit is noise;
#: full precision stays in what the search stores and in ``scalertune report --json``.
READABLE_DIGITS = 4


def shown(value: Any) -> str:
    """``repr(value)``, cut short: a bad value in a one-line error, not a page of digits; a
    number YAML read as text (``1e4``: YAML 1.1's floats need a dot and a signed exponent)
    says how to write it.

    >>> shown("1e4")
    "'1e4' (text: YAML reads this form of a number as text; write 10000)"
    >>> shown("2.5e-7")
    "'2.5e-7' (text: YAML reads this form of a number as text; write 2.5e-07)"
    """
    text = cut(repr(value), 40)
    written = _as_yaml_number(value) if isinstance(value, str) else None
    if written is not None:
        text += f" (text: YAML reads this form of a number as text; write {written})"
    return text


def shown_type(value: Any) -> str:
    """``value``'s type with its article, as a sentence names it.

    >>> shown_type(3), shown_type([]), shown_type(None)
    ('an int', 'a list', 'None')
    """
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def cut(text: str, most: int) -> str:
    """``text`` up to ``most`` characters, its cut marked with ``...``: the rest of a value or
    of a library's message is no use in a one-line error.

    >>> cut("abcdefgh", 6)
    'abc...'
    """
    return text if len(text) <= most else text[: most - 3] + "..."


def _as_yaml_number(value: str) -> str | None:
    """``value`` written so YAML 1.1 (PyYAML's) reads a number, where it is a finite number
    in exponent form that it reads as text (``1e4``, ``2.5E3``, ``1.0e4``): a whole number
    as an integer (what an integer knob takes, and a float knob too), another with a dot and
    a signed exponent; else ``None``."""
    if re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value.strip()) is None:
        return None
    number = float(value)
    if not math.isfinite(number):
        return None
    if number.is_integer() and abs(number) < 2**53:
        return str(int(number))
    text = repr(number)
    if "e" in text:  # YAML's float needs the dot in the mantissa
        mantissa, exponent = f"{number:.15e}".split("e")
        mantissa = mantissa.rstrip("0")
        text = f"{mantissa}{'0' if mantissa.endswith('.') else ''}e{exponent}"
    return text


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 run``, ``2 runs``; ``many`` where adding an s is wrong.

    >>> plural(1, "thread"), plural(2, "thread"), plural(2, "was", "were")
    ('1 thread', '2 threads', '2 were')
    """
    return f"{n} {word}" if n == 1 else f"{n} {many or word + 's'}"


def readable(value: Any, digits: int = READABLE_DIGITS) -> Any:
    """``value`` with every float rounded to ``digits`` significant digits, for reading.

    Containers are rounded element-wise; ints, bools, strings and ``None`` pass unchanged, and
    so do non-finite floats and powers of two (a loss scale of 2**16 reads 65536, not a
    65540 that looks moved). Full precision stays in what the search stores and in
    ``scalertune report --json``.

        >>> readable(0.0030449795900123)
        0.003045
        >>> readable({"min_scale": 224873.125, "final_scale": 65536.0, "skipped_steps": 25})
        {'min_scale': 224900.0, 'final_scale': 65536.0, 'skipped_steps': 25}
    """
    if isinstance(value, float):
        if not math.isfinite(value) or (value and math.frexp(value)[0] in (0.5, -0.5)):
            return value
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: readable(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(readable(v, digits) for v in value)
    return value


def format_table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Columns padded to width: the first two left-aligned (names), the rest right (numbers)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, row in enumerate(rows):
        out.append(
            "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))
            ).rstrip()
        )
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def duration(seconds: float) -> str:
    """A length of time as a person says it, to two units at most.

    >>> duration(42.4), duration(754), duration(3 * 3600 + 20 * 60 + 5), duration(2.5 * 86400)
    ('42 s', '12 min 34 s', '3 h 20 min', '2 days 12 h')
    """
    s = max(0, int(round(seconds)))
    for size, unit, smaller, small_unit in (
        (86400, " days", 3600, " h"),
        (3600, " h", 60, " min"),
        (60, " min", 1, " s"),
    ):
        if s >= size:
            whole, rest = divmod(s, size)
            unit = " day" if unit == " days" and whole == 1 else unit
            return f"{whole}{unit}" + (f" {rest // smaller}{small_unit}" if rest // smaller else "")
    return f"{s} s"
