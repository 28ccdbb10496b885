"""Which characters free text may hold: titles, names, carriers, comments.

Refused everywhere: the C0 controls (NUL included), DEL and the C1 controls, which no person
types and which databases refuse or mangle (PostgreSQL cannot store NUL); lone surrogates, which
JSON's ``\\ud800`` escapes can carry but no UTF-8 encoder can write; and the Unicode
noncharacters (U+FDD0..U+FDEF and the last two code points of every plane, U+FFFE and U+FFFF
among them). Multi-line text (a review comment) may also hold tab, line feed and carriage
return, so a comment typed in a text area with CRLF line ends is kept as written. Everything
else printable or formatting (CJK, emoji with their joiners, right-to-left marks) is text.
"""

from __future__ import annotations

import re

_NONCHARACTERS = "\ufdd0-\ufdef" + "".join(
    f"{chr(plane * 0x10000 + 0xFFFE)}{chr(plane * 0x10000 + 0xFFFF)}" for plane in range(17)
)
_ALWAYS = "\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff" + _NONCHARACTERS
#: What one-line text (a title, a name, a carrier) may not hold.
SINGLE_LINE = re.compile(f"[\x00-\x08\t\n\r{_ALWAYS}]")
#: What multi-line text (a comment) may not hold: the same but tab, line feed and return.
MULTI_LINE = re.compile(f"[\x00-\x08{_ALWAYS}]")


def refused_character(value: str, *, multiline: bool = False) -> str | None:
    """Why ``value`` is not acceptable text, naming its first refused character, or None.

    >>> refused_character("kite\\x00")
    'contains the control character U+0000 at position 5'
    """
    found = (MULTI_LINE if multiline else SINGLE_LINE).search(value)
    if found is None:
        return None
    point = ord(found.group())
    return f"contains {_kind(point)} U+{point:04X} at position {found.start() + 1}"


def _kind(point: int) -> str:
    if point < 0xA0:
        return "the control character"
    if 0xD800 <= point <= 0xDFFF:
        return "a lone surrogate"
    return "the noncharacter"


def checked(value: str, *, multiline: bool = False) -> str:
    """``value`` unchanged when it is acceptable text.

    Raises:
        ValueError: it holds a refused character (the message names it and where).
    """
    problem = refused_character(value, multiline=multiline)
    if problem is not None:
        raise ValueError(problem)
    return value
