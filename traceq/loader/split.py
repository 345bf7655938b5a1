"""Cuts a trace's byte stream into lists of raw events at top-level boundaries, piece by
piece, so the decoder never holds the whole document.

A cut can only fall between two events of `traceEvents`, never inside a string or a nested
value, by construction: each piece starts where the previous one ended, just after a
top-level `,` (or the array's `[`), and a candidate cut (a `}` followed by `,`) is accepted
only when msgspec decodes `[` + piece + `]` as a complete list. A JSON parser reading the
piece from that starting state ends it in the state the real document has there; the
appended `]` completes the list only if that state is "depth 1, after a whole value", so a
cut inside a string (the `]` is then text, and the input ends unterminated) or inside a
nested value (an object or an inner array stays open) cannot decode. The same argument
finds `traceEvents` itself: its key is accepted when the bytes before it plus
`"traceEvents":[]}` decode as the top-level object.

Anything unexpected (not a trace object or array, invalid JSON, nesting too deep) raises
`Unsplittable`; the caller then lets the whole-document decoder explain the problem in the
words it always used.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import msgspec

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOM = b"\xef\xbb\xbf"
_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_AT_BYTE = re.compile(r"\(byte (\d+)\)")


def compact(json: bytes | bytearray | memoryview) -> bytes:
    """`json` without the whitespace between its tokens (msgspec's C formatter, ~0.8 GB/s):
    every string, escape and number keeps its exact text, and the result holds no newline,
    so events join as NDJSON as they are. Kineto indents its traces: the events come out a
    quarter smaller, and each later pass (Polars, msgspec, the `args` column) reads less.
    It parses as strictly as msgspec's decoder and fails with the same messages."""
    return msgspec.json.format(json, indent=-1)


MAX_TRIES = 4  # candidate cuts tried per piece before reading on (a `},` inside a string)
MAX_PROBES = 4096  # `}` looked at per piece, from its end


class Unsplittable(Exception):
    """The stream is not a well-formed trace; the whole-document decoder says why."""


class EventSlices:
    """Iterating yields lists of raw events in order; afterwards `metadata` holds the
    top-level keys other than `traceEvents` (before and after it, in document order)."""

    def __init__(self, pieces: Iterable[bytes]) -> None:
        self._pieces = iter(pieces)
        self.metadata: dict[str, msgspec.Raw] = {}
        self._array_form = False

    def __iter__(self) -> Iterator[list[msgspec.Raw]]:
        rest = self._head()
        for piece in self._pieces:
            slices, rest = _cut(rest + piece)
            if slices:
                yield slices
        yield self._tail(rest)

    def _head(self) -> bytes:
        """Read until the `[` of `traceEvents` (or of a bare event array); return what follows."""
        buf, searched = b"", 0
        for piece in self._pieces:
            if not buf and piece.startswith(_BOM):
                piece = piece[len(_BOM) :]
            buf += piece
            body = buf.lstrip()
            if not body:
                continue
            if body[:1] == b"[":  # the format's "JSON Array" form: just the events
                self._array_form = True
                return body[1:]
            if body[:1] != b"{":
                raise Unsplittable
            for match in _EVENTS_KEY.finditer(buf, searched):
                searched = match.start() + 1
                try:
                    top = _TOP.decode(buf[: match.start()] + b'"traceEvents":[]}')
                except (msgspec.DecodeError, RecursionError):
                    continue
                if bytes(top["traceEvents"]) == b"[]":
                    self.metadata = {k: v for k, v in top.items() if k != "traceEvents"}
                    return buf[match.end() :]
            searched = max(searched, len(buf) - 64)  # a key split across pieces: seen next turn
        raise Unsplittable

    def _tail(self, rest: bytes) -> list[msgspec.Raw]:
        """The last events, and for a trace object the keys after `traceEvents`."""
        try:
            if self._array_form:
                return _LIST.decode(compact(b"[" + rest))
            top = _TOP.decode(b'{"traceEvents":[' + rest)
            slices = _LIST.decode(compact(top.pop("traceEvents")))
        except (msgspec.DecodeError, RecursionError):
            raise Unsplittable from None
        self.metadata.update(top)
        return slices


def _cut(buf: bytes) -> tuple[list[msgspec.Raw], bytes]:
    """The whole events at the start of `buf`, compacted, and the bytes after them (after
    the `,`)."""
    end, tries = len(buf), 0
    for _ in range(MAX_PROBES):
        close = buf.rfind(b"}", 0, end)
        if close < 0:
            break
        end = close
        after = buf[close + 1 : close + 65].lstrip()
        if after[:1] != b",":
            continue
        probe = b"".join((b"[", memoryview(buf)[: close + 1], b"]"))  # one copy, not three
        try:
            slices = _LIST.decode(compact(probe))
        except msgspec.DecodeError as exc:
            _raise_if_invalid(str(exc), len(probe))
        except RecursionError:
            raise Unsplittable from None
        else:
            comma = buf.index(b",", close + 1)
            return slices, buf[comma + 1 :]
        tries += 1
        if tries == MAX_TRIES:
            break
    return [], buf


def _raise_if_invalid(message: str, size: int) -> None:
    """A cut inside a string or a nested value fails at the end of the probe (input ends
    unterminated, or the appended `]` closes the wrong thing), and a cut past the end of
    `traceEvents` leaves trailing characters; failing otherwise means the JSON itself is
    invalid, and reading on would only grow the buffer."""
    if "truncated" in message or "trailing characters" in message:
        return  # "trailing": the cut lies past the array's `]`; the tail reads the rest
    at = _AT_BYTE.search(message)
    if at is None or int(at[1]) < size - 1:
        raise Unsplittable
