"""Reads a trace's bytes from a path or a binary file, gunzipping and guarding against bombs.

The decoder wants one contiguous buffer, so this module's only job is to produce it safely:
gzip is detected by its magic bytes (not the file name), truncated or corrupt streams become
`TraceFileError`, and decompression stops early when the output grows absurdly large.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import BinaryIO

from traceq.errors import TraceFileError, TraceTooLargeError

GZIP_MAGIC = b"\x1f\x8b"
CHUNK = 16 << 20
# A JSON trace compresses 5-30x; past these limits the input is a bomb or not a trace.
MAX_BYTES = int(os.environ.get("TRACEQ_MAX_BYTES", 32 << 30))
MAX_RATIO = 1000
RATIO_FLOOR = 64 << 20  # small files may compress extremely well (all-zero padding, tests)


def describe(src: str | os.PathLike[str] | BinaryIO) -> str:
    """A short name for messages: the path, or the file object's name."""
    if isinstance(src, (str, os.PathLike)):
        return str(src)
    return str(getattr(src, "name", "<stream>"))


def read_bytes(
    src: str | os.PathLike[str] | BinaryIO, *, max_bytes: int = MAX_BYTES
) -> bytes | bytearray:
    """Return the (decompressed) bytes of a trace file."""
    if isinstance(src, (str, os.PathLike)):
        path = Path(src)
        if path.is_dir():
            raise TraceFileError("is a directory, not a trace file")
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise TraceFileError("no such file") from None
        except OSError as exc:
            raise TraceFileError(f"cannot read: {exc.strerror or exc}") from None
    else:
        raw = src.read()
        if isinstance(raw, str):
            raw = raw.encode()
    if not raw:
        raise TraceFileError("empty file")
    if raw[:2] == GZIP_MAGIC:
        return gunzip(raw, max_bytes=max_bytes)
    return raw


def gunzip(raw: bytes, *, max_bytes: int = MAX_BYTES) -> bytearray:
    """Decompress gzip (multi-member too) in chunks, refusing bombs and truncated streams."""
    out = bytearray()
    data = raw
    while data:
        stream = zlib.decompressobj(wbits=31)
        try:
            while data:
                out += stream.decompress(data, CHUNK)
                data = stream.unconsumed_tail
                _check_size(len(out), len(raw), max_bytes)
                if stream.eof:
                    break
            if not stream.eof:
                raise TraceFileError("truncated gzip stream (the file ends mid-way)")
        except zlib.error as exc:
            raise TraceFileError(f"corrupt gzip data ({exc})") from None
        data = stream.unused_data.lstrip(b"\x00")
        if data and data[:2] != GZIP_MAGIC:
            break  # trailing garbage after the last member, as gzip(1) tolerates
    if not out:
        raise TraceFileError("gzip holds an empty file")
    return out


def _check_size(size: int, compressed: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise TraceTooLargeError(
            f"decompresses to more than {max_bytes >> 20} MiB (set TRACEQ_MAX_BYTES to allow more)"
        )
    if size > RATIO_FLOOR and size > MAX_RATIO * compressed:
        raise TraceTooLargeError(
            f"gzip expands more than {MAX_RATIO}x ({compressed} bytes -> over {size >> 20} MiB): "
            "not a trace"
        )
