"""Reads a trace's bytes from a path or a binary file, gunzipping and guarding against bombs.

`Stream` hands the (decompressed) bytes over in pieces, so the decoder never needs the
whole expansion at once; `read_bytes` joins them for callers that want one buffer. gzip is
detected by its magic bytes (not the file name), truncated or corrupt streams become
`TraceFileError`, and decompression stops early when the output grows absurdly large.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import BinaryIO

from traceq.errors import TraceFileError, TraceTooLargeError


def _inflater() -> ModuleType:
    """Intel's ISA-L (`isal`) where it is installed: zlib's interface, inflating about twice
    as fast (588 MB of trace JSON: 0.63-0.70 against 1.2-1.5 CPU s), which is a tenth of a
    job's map per gzipped rank. The standard library's zlib elsewhere."""
    try:
        from isal import isal_zlib
    except ImportError:  # a platform without its wheels
        import zlib

        return zlib
    return isal_zlib


inflate = _inflater()

GZIP_MAGIC = b"\x1f\x8b"
CHUNK = 16 << 20  # output per decompress call
IN_CHUNK = 1 << 20  # compressed input per step
# A JSON trace compresses 5-30x (30x at most across ../shared/traces); past these limits
# the input is a bomb or not a trace. Deflate peaks near 1032x, on runs of one byte.
MAX_BYTES = 32 << 30
MAX_RATIO = 200
RATIO_FLOOR = 64 << 20  # small files may compress extremely well (all-zero padding, tests)


def max_bytes_allowed() -> int:
    """The decompressed size limit: `TRACEQ_MAX_BYTES` when set, else 32 GiB."""
    text = os.environ.get("TRACEQ_MAX_BYTES", "").strip()
    if not text:
        return MAX_BYTES
    try:
        return int(text)
    except ValueError:
        raise TraceFileError(f"TRACEQ_MAX_BYTES must be a number of bytes, not {text!r}") from None


def describe(src: str | os.PathLike[str] | BinaryIO) -> str:
    """A short name for messages: the path, or the file object's name."""
    if isinstance(src, (str, os.PathLike)):
        return str(src)
    return str(getattr(src, "name", "<stream>"))


class Stream:
    """A trace's (decompressed) bytes as pieces of about `CHUNK`, read as they are needed,
    so no more than one piece of the file and one of its expansion is held at a time.

    `total` is the file's size when known and `read` the bytes read from it so far (what a
    progress display shows: for gzip, compressed bytes). Errors are `TraceFileError`s, each
    raised when the bad part is reached. A path is opened on the first piece and closed
    after the last; a file object is read from where it stands and left open.
    """

    def __init__(
        self, src: str | os.PathLike[str] | BinaryIO, *, max_bytes: int | None = None
    ) -> None:
        self.src = src
        self.limit = max_bytes_allowed() if max_bytes is None else max_bytes
        self.total: int | None = None
        self.read = 0
        if isinstance(src, (str, os.PathLike)):
            path = Path(src)
            if path.is_dir():
                raise TraceFileError("is a directory, not a trace file")
            try:
                self.total = path.stat().st_size
            except FileNotFoundError:
                raise TraceFileError("no such file") from None
            except OSError as exc:
                raise TraceFileError(f"cannot read: {exc.strerror or exc}") from None
            if self.total > self.limit:
                raise _too_large(self.total, self.limit)

    def __iter__(self) -> Iterator[bytes]:
        if isinstance(self.src, (str, os.PathLike)):
            try:
                file = Path(self.src).open("rb")  # noqa: SIM115 - closed below, after the last piece
            except OSError as exc:
                raise TraceFileError(f"cannot read: {exc.strerror or exc}") from None
            with file:
                yield from self._pieces(file)
        else:
            yield from self._pieces(self.src)

    def _pieces(self, file: BinaryIO) -> Iterator[bytes]:
        first = self._read(file, IN_CHUNK)
        if not first:
            raise TraceFileError("empty file")
        if first[:2] == GZIP_MAGIC:
            yield from self._gunzip(file, first)
            return
        data, size = first, 0
        while data:
            size += len(data)
            if size > self.limit:
                raise TraceTooLargeError(
                    f"is over the {_size(self.limit)} limit (set TRACEQ_MAX_BYTES to allow more)"
                )
            yield data
            data = self._read(file, CHUNK)

    def _read(self, file: BinaryIO, n: int) -> bytes:
        try:
            data = file.read(n)
        except OSError as exc:
            raise TraceFileError(f"cannot read: {exc.strerror or exc}") from None
        if isinstance(data, str):
            data = data.encode()
        self.read += len(data)
        return data

    def _gunzip(self, file: BinaryIO, data: bytes) -> Iterator[bytes]:
        """Decompress gzip (multi-member too) piece by piece, refusing bombs and truncated
        streams. Input is fed 1 MiB at a time, so the ratio check sees the bytes consumed so
        far (a bomb is stopped after RATIO_FLOOR of output, however long the file).

        The pieces are a plain file's: its first `IN_CHUNK` (read to look for the gzip
        magic), then whole `CHUNK`s. The input is topped up to `IN_CHUNK` before each call,
        so a call fills the piece (unless the data inflates less than 16x, when parts are
        joined). Fed only once used up, a MiB of input that inflates to 19 MiB came out as
        16 MiB and then 3 MiB, and the decoder paid its per-piece work on 58 pieces
        instead of 37 (2.16M events). The same pieces make the same batches, and where
        batches fall moves the load's peak: 2.16M events from `.json.gz` in 16 MiB pieces
        from the start peaked at 942-948 MiB, as `.json` read that way does (977-993),
        against 889-892 from `.json`."""
        size, room = 0, IN_CHUNK
        while True:  # one gzip member per turn
            member = inflate.decompressobj(wbits=31)
            parts: list[bytes] = []
            while not member.eof:
                if len(data) < IN_CHUNK:
                    data += self._read(file, IN_CHUNK)
                    if not data:
                        raise TraceFileError("truncated gzip stream (the file ends mid-way)")
                try:
                    piece = member.decompress(data, room)
                except inflate.error as exc:
                    raise TraceFileError(f"corrupt gzip data ({exc})") from None
                data = member.unconsumed_tail
                size += len(piece)
                _check_size(size, self.read - len(data) - len(member.unused_data), self.limit)
                if piece:
                    parts.append(piece)
                    room -= len(piece)
                if not room:
                    yield b"".join(parts)  # one part: that same object, not a copy
                    parts, room = [], CHUNK
            if parts:
                yield b"".join(parts)
                room = CHUNK
            data = member.unused_data
            while len(data := data.lstrip(b"\x00")) < 2:  # padding between or after members
                more = self._read(file, IN_CHUNK)
                if not more:
                    break
                data += more
            if data[:2] != GZIP_MAGIC:
                break  # the end, or trailing garbage after the last member, as gzip(1) tolerates
        if not size:
            raise TraceFileError("gzip holds an empty file")


def read_bytes(
    src: str | os.PathLike[str] | BinaryIO, *, max_bytes: int | None = None
) -> bytes | bytearray:
    """Return the (decompressed) bytes of a trace file, at most `max_bytes` of them."""
    out = bytearray()
    for piece in Stream(src, max_bytes=max_bytes):
        out += piece
    return out


def _too_large(size: int, limit: int) -> TraceTooLargeError:
    return TraceTooLargeError(
        f"is {_size(size)}, over the {_size(limit)} limit (set TRACEQ_MAX_BYTES to allow more)"
    )


def gunzip(raw: bytes, *, max_bytes: int = MAX_BYTES) -> bytearray:
    """Decompress a whole gzip file held in memory (see `Stream`)."""
    return read_bytes(io.BytesIO(raw), max_bytes=max_bytes)


def _check_size(size: int, compressed: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise TraceTooLargeError(
            f"decompresses to more than {_size(max_bytes)} (set TRACEQ_MAX_BYTES to allow more)"
        )
    if size > RATIO_FLOOR and size > MAX_RATIO * compressed:
        raise TraceTooLargeError(
            f"gzip expands more than {MAX_RATIO}x ({compressed} bytes -> over {size >> 20} MiB): "
            "not a trace"
        )


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"
