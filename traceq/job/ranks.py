"""Which files make a job, and which rank each file is — read from a few KB of each file.

A rank is taken from the trace's own `distributedInfo.rank` when the head of the file has
it (Kineto writes it before `traceEvents`), else from a number in the file name
(`rank-3.json.gz`, `rank3`, `_r3.`), else from the file's place in sorted order; each rank
says which (`rank_source`). Nothing here decodes a whole trace: listing a 1,000-rank job
reads 1,000 heads, not 1,000 traces.
"""

from __future__ import annotations

import glob
import json
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceq.errors import TraceFileError

TRACE_SUFFIXES = (".json", ".json.gz")
HEAD_BYTES = 1 << 20  # decompressed bytes searched for distributedInfo
HEAD_STEP = 64 << 10  # the first head read, doubled until distributedInfo is found
RANK_IN_NAME = re.compile(r"(?:rank|worker|_r)[-_]?(\d+)(?!.*(?:rank|worker)[-_]?\d)", re.I)
_DIST_KEY = re.compile(rb'"distributedInfo"\s*:\s*\{')


@dataclass
class RankFile:
    """One file of a job: its path, its rank and how that rank was found, what its head
    says about the job (world size, process groups), and its uncompressed size."""

    path: str
    rank: int
    rank_source: str
    distributed: dict[str, Any] = field(default_factory=dict)
    size_bytes: int = 0


def trace_paths(src: str | os.PathLike[str] | list[str | os.PathLike[str]]) -> list[str]:
    """The trace files of `src`: a directory (its `*.json` / `*.json.gz`, not recursive),
    a glob pattern, one file, or a list of those."""
    if isinstance(src, (list, tuple)):
        return [p for item in src for p in trace_paths(item)]
    text = os.fspath(src)
    path = Path(text)
    if path.is_dir():
        files = sorted(str(p) for p in path.iterdir() if p.is_file() and _is_trace(p.name))
        if not files:
            raise TraceFileError("directory holds no .json or .json.gz trace", source=text)
        return files
    if glob.has_magic(text):
        files = sorted(p for p in glob.glob(text) if Path(p).is_file())
        if not files:
            raise TraceFileError("pattern matches no file", source=text)
        return files
    if not path.exists():
        raise TraceFileError("no such file", source=text)
    return [text]


def _is_trace(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES) and name != "manifest.json"


def head(path: str, limit: int = HEAD_BYTES) -> bytes:
    """The first `limit` decompressed bytes of a (gzipped or plain) trace file."""
    *_, text = _heads(path, limit)  # the last, longest head
    return text


def _heads(path: str, limit: int = HEAD_BYTES) -> Iterator[bytes]:
    """Ever longer heads of the file, decompressed: 64 KB, 128 KB, ... up to `limit`, so a
    reader that finds what it wants early (Kineto writes `distributedInfo` in the first few
    KB) decompresses no more. Each step decompresses only the bytes it adds."""
    try:
        with open(path, "rb") as f:
            raw = f.read(limit)
    except OSError as exc:
        raise TraceFileError(f"cannot read: {exc.strerror or exc}", source=path) from None
    if raw[:2] != b"\x1f\x8b":
        yield raw
        return
    stream = zlib.decompressobj(wbits=31)
    text, pending, step = b"", raw, HEAD_STEP
    while True:
        try:
            text += stream.decompress(pending, min(step, limit) - len(text))
        except zlib.error:
            text = b""  # the full load reports the corruption, with its message
            break
        pending = stream.unconsumed_tail
        if stream.eof or not pending or len(text) >= limit:
            break
        yield text
        step *= 2
    yield text


def head_distributed_info(path: str) -> dict[str, Any]:
    """`distributedInfo` from the head of `path` (the first `HEAD_BYTES`), decompressing
    only as far as it reaches."""
    for text in _heads(path):
        info = distributed_info(text)
        if info:
            return info
    return {}


def distributed_info(text: bytes) -> dict[str, Any]:
    """`distributedInfo` from the head of a trace, or {} when it is not there (or cut off)."""
    match = _DIST_KEY.search(text)
    if not match:
        return {}
    depth, start = 0, match.end() - 1
    for i in range(start, len(text)):
        ch = text[i : i + 1]
        if ch == b"{":
            depth += 1
        elif ch == b"}":
            depth -= 1
            if depth == 0:
                try:
                    info = json.loads(text[start : i + 1])
                except ValueError:
                    return {}
                return info if isinstance(info, dict) else {}
    return {}


def uncompressed_size(path: str) -> int:
    """The file's size once decompressed: gzip's ISIZE trailer (exact below 4 GiB), or the
    file size for plain JSON. Sizes the worker pool before anything is loaded."""
    size = os.path.getsize(path)
    if size < 18:
        return size
    with open(path, "rb") as f:
        if f.read(2) != b"\x1f\x8b":
            return size
        f.seek(-4, os.SEEK_END)
        isize = int.from_bytes(f.read(4), "little")
    return max(isize, size)


def rank_files(paths: list[str]) -> tuple[list[RankFile], list[str]]:
    """A `RankFile` per path, and the problems seen (duplicate ranks, mixed sources)."""
    found: list[RankFile] = []
    for path in paths:
        info = head_distributed_info(path)
        rank = info.get("rank")
        source = "distributedInfo"
        if not isinstance(rank, int) or isinstance(rank, bool):
            match = RANK_IN_NAME.search(Path(path).name)
            rank, source = (int(match.group(1)), "file name") if match else (None, "order")
        found.append(
            RankFile(path, rank if rank is not None else -1, source, info, uncompressed_size(path))
        )
    problems: list[str] = []
    taken = {f.rank for f in found if f.rank_source != "order"}
    next_free = 0
    for f in found:
        if f.rank_source == "order":
            while next_free in taken:
                next_free += 1
            f.rank = next_free
            taken.add(next_free)
            problems.append(
                f"{f.path}: no rank in distributedInfo or the file name; rank {f.rank} by order"
            )
    by_rank: dict[int, list[RankFile]] = {}
    for f in found:
        by_rank.setdefault(f.rank, []).append(f)
    for rank, files in sorted(by_rank.items()):
        if len(files) > 1:
            names = ", ".join(Path(f.path).name for f in files)
            problems.append(f"rank {rank} appears {len(files)} times ({names}); the first is used")
    unique = [files[0] for _, files in sorted(by_rank.items())]
    return unique, problems
