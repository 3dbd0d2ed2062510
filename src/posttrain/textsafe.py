"""Text from users (a reward function's error, a data row, a remote traceback) made safe to print.

A message that echoes user text must not let that text drive the terminal: ANSI escape sequences
could recolour, hide or rewrite the line, a carriage return could overwrite it, a bidi override
could reorder it. :func:`sanitize` removes escape sequences and shows every other control
character as its ``\\x..`` escape; the user-error boundary applies it to every line it prints.
"""

from __future__ import annotations

import re

#: CSI (``ESC [ ... final``), OSC (``ESC ] ... BEL|ST``), other two-byte ``ESC x`` sequences,
#: and the 8-bit CSI.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]|\x9b[0-?]*[ -/]*[@-~]"
)
#: A piece of user text quoted in a message is cut to this many characters.
MAX_QUOTED = 300


def sanitize(text: str) -> str:
    """``text`` without escape sequences; tabs and line breaks become spaces, any other
    non-printable character (C0/C1 controls, bidi overrides, a stray ESC) its escape."""
    text = _ESCAPES.sub("", text)
    if text.isprintable():
        return text
    return "".join(_safe_char(ch) for ch in text)


def _safe_char(ch: str) -> str:
    if ch.isprintable():
        return ch
    if ch in "\t\n\r\v\f":
        return " "
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def exception_text(error: BaseException, limit: int = MAX_QUOTED) -> str:
    """``Type: message`` of an exception raised by user code, safe to print: sanitized, cut
    to ``limit`` characters, and still an answer when the exception's own ``str()`` raises."""
    name = type(error).__name__
    try:
        message = str(error)
    except BaseException as inner:  # noqa: BLE001 - a broken __str__ must not hide the error
        message = f"<its str() raised {type(inner).__name__}>"
    message = " ".join(sanitize(message).split())
    if len(message) > limit:
        message = message[: limit - 3] + "..."
    return f"{name}: {message}" if message else name
