"""Control characters in names: C0 (U+0000..U+001F), DEL (U+007F) and C1 (U+0080..U+009F).

URL parsers drop some of them (`urllib.parse.urlsplit` removes tab, CR and LF), terminals and logs act on others,
and none belongs in a table location or a data file's path: a name holding one can name another object than the
one it reads as. Table URIs (`deltacoord.storage.uri`) and the file paths of add, remove and cdc actions (the writer
before sending, `deltacoord.writer.transaction`; the coordinator when it validates, `deltacoord.coordinator.rules.validate`) refuse them.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

#: One C-speed scan per name: a commit of 100,000 files checks 200,000 paths.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_C0_OR_DEL = re.compile(r"[\x00-\x1f\x7f]")


def is_control(c: str) -> bool:
    """A C0 control, DEL, or a C1 control."""
    o = ord(c)
    return o < 0x20 or 0x7F <= o <= 0x9F


def control_character(text: str) -> str | None:
    """How the first control character of `text` is named ('U+000A (LF) at index 3'), or None when it has none."""
    m = _CONTROL.search(text)
    if m is None:
        return None
    o = ord(m.group())
    name = _NAMES.get(o)
    return f"U+{o:04X}{f' ({name})' if name else ''} at index {m.start()}"


def path_control_character(path: str) -> str | None:
    """Why a data file's path (an add, remove or cdc action's, URI-encoded as Delta writes it) holds a control
    character, or None: any raw C0, DEL or C1 control, or a percent-encoded C0 or DEL (`%0A`: the file's name would
    hold a newline, which object keys refuse). A percent-encoded C1 (`%C2%85`) is how Spark writes a partition
    value holding one, and stays allowed."""
    found = control_character(path)
    if found is not None:
        return f"holds a raw control character, {found}"
    if "%" in path:
        m = _C0_OR_DEL.search(unquote(path))
        if m is not None:
            o = ord(m.group())
            name = _NAMES.get(o)
            return (f"holds a percent-encoded control character, U+{o:04X}{f' ({name})' if name else ''} "
                    f"at index {m.start()} of the decoded path")
    return None


_NAMES = {0x00: "NUL", 0x09: "tab", 0x0A: "LF, a newline", 0x0D: "CR", 0x1B: "ESC", 0x7F: "DEL", 0x85: "NEL"}

__all__ = ["control_character", "is_control", "path_control_character"]
