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

Candidates come two ways. Quick tries first: the last few `}` followed by `,` in the
buffer. Where those fail (`},` inside strings or nested values, an event longer than a
piece), the cutter scans for the rest of the stream: a tokenizer (in a string or not,
after a backslash, depth) carried from piece to piece names the last top-level comma, so
each byte is scanned once and probed once, and cutting stays linear in the document's size
whatever its strings hold. The scan only proposes; the probe still proves each cut. The
tokenizer is `_events.scan` where the C pass is built and not turned off, `scan` here
otherwise (the same answers, slower).

Anything unexpected (not a trace object or array, invalid JSON, nesting too deep) raises
`Unsplittable`; the caller then lets the whole-document decoder explain the problem in the
words it always used.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator

import msgspec

try:  # the tokenizer in C, beside the C pass (setup.py builds it where a compiler is)
    from traceq.loader import _events
except ImportError:  # pragma: no cover - the test suite runs where it is built
    _events = None  # type: ignore[assignment]

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


MAX_TRIES = 4  # quick candidate cuts tried per piece before the cutter scans instead
MAX_PROBES = 4096  # `}` looked at per piece, from its end

# The tokenizer's tokens: a string (its closing quote in group 1) or a bracket or comma;
# and the rest of a string begun in an earlier piece.
_TOKEN = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+(")?|[{}\[\],]', re.DOTALL)
_STRING_REST = re.compile(rb'[^"\\]*+(?:\\.[^"\\]*+)*+(")?', re.DOTALL)
Scan = Callable[[bytes | bytearray, int, int], tuple[int, int]]


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
        cutter = _Cutter(self._head(), tokenizer())
        for piece in self._pieces:
            slices = cutter.feed(piece)
            if slices:
                yield slices
        yield self._tail(bytes(cutter.buf))

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
        if not self._array_form and _EVENTS_KEY.search(rest):
            # Perhaps a second `traceEvents` key, whose array JSON readers keep (the last
            # wins) while the events cut so far are the first's: `decode` reads it whole.
            raise Unsplittable
        try:
            if self._array_form:
                return _LIST.decode(compact(b"[" + rest))
            top = _TOP.decode(b'{"traceEvents":[' + rest)
            slices = _LIST.decode(compact(top.pop("traceEvents")))
        except (msgspec.DecodeError, RecursionError):
            raise Unsplittable from None
        self.metadata.update(top)
        return slices


def tokenizer() -> Scan:
    """`_events.scan` where the C pass is built and not turned off (`TRACEQ_NATIVE=0`),
    else `scan`."""
    if _events is not None and os.environ.get("TRACEQ_NATIVE") != "0":
        return _events.scan
    return scan


class _Cutter:
    """The bytes not yet cut (`buf`, from a top-level boundary on) and how to cut them:
    the quick tries while they work, then the tokenizer, its state (`state`, at `scanned`)
    carried from piece to piece. A piece is appended, never re-joined with what came
    before, and a cut drops its bytes from the front (both amortized O(1) a byte)."""

    def __init__(self, rest: bytes, scan: Scan) -> None:
        self.buf = bytearray(rest)
        self._scan = scan
        self._state: int | None = None  # None: the quick tries; an int: scanning
        self._scanned = 0

    def feed(self, piece: bytes) -> list[msgspec.Raw]:
        """The whole events that `piece` completes, compacted (perhaps none)."""
        self.buf += piece
        if self._state is None:
            slices, rest = _cut(self.buf)
            if rest is not None and len(self.buf) - rest <= max(len(piece), 1 << 16):
                del self.buf[:rest]
                return slices
            # The tries failed, or left more than a piece: were they tried again on a buffer
            # that grows, each piece would cost the whole buffer. Scan from here on.
            if rest is not None:
                del self.buf[:rest]
            self._state, self._scanned = 0, 0
            if slices:
                return slices + self.feed(b"")
        comma, self._state = self._scan(self.buf, self._scanned, self._state)
        self._scanned = len(self.buf)
        if comma < 0:
            return []
        slices = _probe(self.buf, comma)
        del self.buf[: comma + 1]
        self._scanned -= comma + 1
        return slices


def _probe(buf: bytearray, end: int) -> list[msgspec.Raw]:
    """The events in `buf[:end]`, which the tokenizer says end at a top-level comma. Only
    invalid JSON can make msgspec disagree; the whole-document decoder then says why."""
    with memoryview(buf) as view:
        probe = b"".join((b"[", view[:end], b"]"))
    try:
        return _LIST.decode(compact(probe))
    except (msgspec.DecodeError, RecursionError):
        raise Unsplittable from None


def _cut(buf: bytes | bytearray) -> tuple[list[msgspec.Raw], int | None]:
    """The quick tries: the whole events at the start of `buf`, compacted, and where the
    bytes after them start (after the `,`); None there where no try succeeded."""
    end, tries = len(buf), 0
    for _ in range(MAX_PROBES):
        close = buf.rfind(b"}", 0, end)
        if close < 0:
            break
        end = close
        after = buf[close + 1 : close + 65].lstrip()
        if after[:1] != b",":
            continue
        with memoryview(buf) as view:
            probe = b"".join((b"[", view[: close + 1], b"]"))  # one copy, not three
        try:
            slices = _LIST.decode(compact(probe))
        except msgspec.DecodeError as exc:
            _raise_if_invalid(str(exc), len(probe))
        except RecursionError:
            raise Unsplittable from None
        else:
            return slices, buf.index(b",", close + 1) + 1
        tries += 1
        if tries == MAX_TRIES:
            break
    return [], None


def scan(buf: bytes | bytearray, start: int, state: int) -> tuple[int, int]:
    """`_events.scan` in Python (the same answers): the offset of the last top-level comma
    of `traceEvents` in `buf[start:]` (-1: none) and the tokenizer's state at the end of
    `buf` (depth << 2 | in a string << 1 | after a backslash; -1 once the array closed).
    `buf` starts just inside the array or after a top-level comma; `state` is where the
    scan of `buf[:start]` left off (0 at the start)."""
    if state == -1:
        return -1, -1
    depth, comma, at, size = state >> 2, -1, start, len(buf)
    if state & 2:  # in a string
        if state & 1 and at < size:  # the byte after a backslash
            state, at = state & ~1, at + 1
        if state & 1 or at == size:
            return -1, state
        rest = _STRING_REST.match(buf, at)
        assert rest is not None  # it matches the empty string
        if rest[1] is None:
            return -1, depth << 2 | 2 | (rest.end() < size)
        at = rest.end()
    for token in _TOKEN.finditer(buf, at):
        byte = buf[token.start()]
        if byte == 0x22:  # a string; open to the end of `buf` (perhaps after a backslash)
            if token[1] is None:
                return comma, depth << 2 | 2 | (token.end() < size)
        elif byte == 0x2C:  # ,
            if depth == 0:
                comma = token.start()
        elif byte in b"{[":
            depth += 1
        elif depth == 0:  # the array's `]` (or a stray `}`: the probe finds that out)
            return comma, -1
        else:
            depth -= 1
    return comma, depth << 2


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
