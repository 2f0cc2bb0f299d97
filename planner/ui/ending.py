"""How a command ends: one JSON document on stdout under ``--json`` whatever the exit, and
SIGTERM (what CI sends on cancel) handled as a Ctrl-C is, with exit 143.

CONTRACT: with ``--json`` stdout holds exactly one JSON document, errors included::

    {"error": {"kind": "bad_input" | "no" | "interrupted", "message": "...", "file": ...,
               "place": ..., "fix": ..., "where": ...}, "exit": 2}

The paragraph still goes to stderr. ``file``, ``place`` and ``fix`` are read from the
paragraph (which names the file, the place and what to do) and are null where it does not
say them; ``where`` is ``file:place`` (or either alone).

This module imports nothing heavy: the console script (``planner.ui.entry``) uses it while
the command line's imports are still running.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import unicodedata
from collections.abc import Sequence
from typing import Any

__all__ = ["Answer", "Terminated", "error_doc", "exit_code", "interrupted_kind", "json_wanted",
           "kind_of", "on_sigterm", "write_doc", "write_error"]


class Answer:
    """Whether this command answers in JSON and has printed its one document."""

    wanted = False
    printed = False
    signum = signal.SIGINT  # the signal that stopped the command (SIGTERM: exit 143)
    argv: tuple[str, ...] = ()  # the command line's words, as typed

    @classmethod
    def reset(cls, argv: Sequence[str]) -> None:
        """A new command line (tests run many in one process)."""
        cls.argv = tuple(argv)
        cls.wanted = json_wanted(argv)
        cls.printed = False
        cls.signum = signal.SIGINT


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where a Ctrl-C would be: every path that cleans up after a Ctrl-C
    (workers stopped, partial files removed, Ray shut down) cleans up after it too."""


def json_wanted(argv: Sequence[str]) -> bool:
    """Whether the command line asks for ``--json`` (before a ``--``)."""
    args = list(argv)
    if "--" in args:
        args = args[:args.index("--")]
    return "--json" in args


def exit_code() -> int:
    """The exit code of a stopped command: 130 after SIGINT, 143 after SIGTERM."""
    return 128 + int(Answer.signum)


def interrupted_kind(code: int) -> bool:
    """Whether an exit code is a signal's (130, 143)."""
    return code in (128 + signal.SIGINT, 128 + signal.SIGTERM)


def kind_of(code: int) -> str:
    """The error kind of an exit code."""
    if interrupted_kind(code):
        return "interrupted"
    return "bad_input" if code == 2 else "no"


# "FILE:LINE:COL: ...", "FILE:PLACE: ...", "FILE: ...", "--option FILE: ..."
_OPTION_LED = re.compile(r"^(?P<option>--?[\w/-]+) (?P<file>\S+?): ")
_FILE_LED = re.compile(r"^(?P<file>[^\s:]+?)(?::(?P<place>[^\s:][^\s]*?))?: ")


def _looks_like_file(text: str) -> bool:
    return "/" in text or bool(re.search(r"\.[A-Za-z][A-Za-z0-9]{0,6}$", text)) \
        or os.path.exists(text)


def _parts(message: str) -> tuple[str | None, str | None, str | None]:
    """(file, place, fix) as the paragraph states them, None where it does not."""
    file = place = None
    m = _OPTION_LED.match(message)
    if m is not None and _looks_like_file(m["file"]):
        file, place = m["file"], m["option"]
    else:
        m = _FILE_LED.match(message)
        if m is not None and _looks_like_file(m["file"]):
            file, place = m["file"], m["place"]
    if place is None:  # the planners' messages name the layer
        layer = re.search(r"\blayer '[^']*'", message)
        place = layer.group(0) if layer is not None else None
    # the first sentence says what is wrong, the rest what to do
    sentences = re.split(r"(?<=[.;)])\s+(?=[A-Z`])", message.strip(), maxsplit=1)
    fix = sentences[1] if len(sentences) == 2 else None
    return file, place, fix


def error_doc(message: str, code: int, kind: str | None = None, place: str | None = None,
              fix: str | None = None) -> dict[str, Any]:
    """The ``--json`` document of a command that ended with `code` and said `message`
    (`place` and `fix` when the caller knows them better than the paragraph says)."""
    text = " ".join(message.split())
    file, said_place, said_fix = _parts(text)
    place, fix = place or said_place, fix or said_fix
    where = ":".join(p for p in (file, place) if p) or None
    return {"error": {"kind": kind or kind_of(code), "message": text, "file": file,
                      "place": place, "fix": fix, "where": where}, "exit": code}


def write_doc(doc: Any) -> None:
    """Print the command's one JSON document on stdout."""
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    sys.stdout.flush()
    Answer.printed = True


def write_error(message: str, code: int, kind: str | None = None, place: str | None = None,
                fix: str | None = None) -> None:
    """Under ``--json``, print the error document unless the command printed its own."""
    if Answer.wanted and not Answer.printed:
        write_doc(error_doc(message, code, kind, place, fix))


def on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM's handler once the command line is imported: stop as a Ctrl-C does."""
    Answer.signum = signal.SIGTERM
    raise Terminated


def printable(text: str, keep: str = "") -> str:
    """`text` with its control and format characters (but those in `keep`) written as
    Python escapes (``\\n``, ``\\x1b``, ``\\u202e``): a layer name may hold any of them
    (ONNX allows it), and shown as it is one would move the cursor, clear the screen or
    reverse the rest of the line."""
    if text.isprintable():
        return text
    return "".join(c if c in keep or unicodedata.category(c) not in ("Cc", "Cf")
                   else c.encode("unicode_escape").decode("ascii") for c in text)
