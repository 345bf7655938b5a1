"""Reads a trace's bytes from a path or a binary file, gunzipping and guarding against bombs.

The decoder wants one contiguous buffer, so this module's only job is to produce it safely:
gzip is detected by its magic bytes (not the file name), truncated or corrupt streams become
`TraceFileError`, and decompression stops early when the output grows absurdly large.
"""

from __future__ import annotations

import os
import re
import zlib
from pathlib import Path
from typing import BinaryIO

from traceq.errors import TraceFileError, TraceTooLargeError

GZIP_MAGIC = b"\x1f\x8b"
CHUNK = 16 << 20  # output per decompress call
IN_CHUNK = 1 << 20  # compressed input per step
_NUL_RUN = re.compile(rb"\x00*")  # padding some tools leave between or after members
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


def read_bytes(
    src: str | os.PathLike[str] | BinaryIO, *, max_bytes: int | None = None
) -> bytes | bytearray:
    """Return the (decompressed) bytes of a trace file, at most `max_bytes` of them."""
    limit = max_bytes_allowed() if max_bytes is None else max_bytes
    if isinstance(src, (str, os.PathLike)):
        path = Path(src)
        if path.is_dir():
            raise TraceFileError("is a directory, not a trace file")
        try:
            size = path.stat().st_size
            if size > limit:
                raise _too_large(size, limit)
            raw = path.read_bytes()
        except FileNotFoundError:
            raise TraceFileError("no such file") from None
        except OSError as exc:
            raise TraceFileError(f"cannot read: {exc.strerror or exc}") from None
    else:
        try:
            raw = src.read()
        except OSError as exc:
            raise TraceFileError(f"cannot read: {exc.strerror or exc}") from None
        if isinstance(raw, str):
            raw = raw.encode()
    if not raw:
        raise TraceFileError("empty file")
    if raw[:2] == GZIP_MAGIC:
        return gunzip(raw, max_bytes=limit)
    if len(raw) > limit:
        raise _too_large(len(raw), limit)
    return raw


def _too_large(size: int, limit: int) -> TraceTooLargeError:
    return TraceTooLargeError(
        f"is {_size(size)}, over the {_size(limit)} limit (set TRACEQ_MAX_BYTES to allow more)"
    )


def gunzip(raw: bytes, *, max_bytes: int = MAX_BYTES) -> bytearray:
    """Decompress gzip (multi-member too) in chunks, refusing bombs and truncated streams.

    Input is fed 1 MiB at a time, so the ratio check sees the bytes consumed so far (a bomb
    is stopped after RATIO_FLOOR of output, however long the file) and no call copies the
    rest of a large input.
    """
    out = bytearray()
    view = memoryview(raw)
    pos = 0
    while True:
        stream = zlib.decompressobj(wbits=31)
        at, data = pos, b""
        try:
            while not stream.eof:
                if at >= len(raw):
                    raise TraceFileError("truncated gzip stream (the file ends mid-way)")
                data = view[at : at + IN_CHUNK]
                at += len(data)
                while True:
                    piece = stream.decompress(data, CHUNK)
                    out += piece
                    data = stream.unconsumed_tail
                    _check_size(len(out), at - len(data), max_bytes)
                    if stream.eof or (not data and len(piece) < CHUNK):
                        break
        except zlib.error as exc:
            raise TraceFileError(f"corrupt gzip data ({exc})") from None
        pos = _NUL_RUN.match(raw, at - len(data) - len(stream.unused_data)).end()
        if bytes(view[pos : pos + 2]) != GZIP_MAGIC:
            break  # the end, or trailing garbage after the last member, as gzip(1) tolerates
    if not out:
        raise TraceFileError("gzip holds an empty file")
    return out


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
