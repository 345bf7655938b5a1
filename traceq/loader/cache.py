"""A columnar cache of loaded traces: the typed, linked frames, so a second load reads
columns instead of parsing JSON again (people run `analyze`, `query`, `check` on one trace
over and over).

**Where.** `TRACEQ_CACHE_DIR` when set, else the platform's user cache folder:
`$XDG_CACHE_HOME/traceq` (default `~/.cache/traceq`) on Linux and other Unixes,
`~/Library/Caches/traceq` on macOS, `%LOCALAPPDATA%\\traceq\\Cache` on Windows. These are
the three rules platformdirs would apply; ten lines here are cheaper than a dependency.
`TRACEQ_CACHE=0` (or `load(..., cache=False)`, `--no-cache` on the command line) turns the
cache off.

**Key.** An entry belongs to one file at one path: its resolved path, size, `st_mtime_ns`,
and a BLAKE2 hash of sampled bytes (the first and last MiB, and 64 KiB at 32 evenly spaced
offsets: 6 MiB at most, milliseconds to read). Size and mtime catch almost every change; the
sample catches a rewrite that keeps both (`cp -p`, `rsync -t`, `touch -r`, a tar extract),
at least wherever the bytes differ in a sampled region. Hashing the whole file would be
exact but costs about a second per GB, as much as the cached load itself. The path is part
of the key because a false hit gives wrong answers while a copy that misses costs one cold
load. The key also holds `SCHEMA_VERSION`, a digest of the source of the modules that build
the frames (a change there invalidates every entry even if nobody bumps the version), and
the versions of traceq, Polars and msgspec.

**Format.** One uncompressed ZIP per entry, `<key>.traceq.zip`: `meta.json` (the key's
parts, the top-level metadata, each frame's rows and schema) and one Arrow IPC file per
frame, zstd-compressed by Polars (the 2.16M-event trace's frames take ~60 MB instead of
1.2 GB). ZIP gives each member a CRC-32.

**Reading.** A hit costs what `read` verifies, not what the frames hold: every member is
read and its CRC-32 checked, and each frame's IPC footer must give the schema and rows
`meta.json` recorded (~60 ms for the 2.16M-event trace). Decoding is left to first use
(`Stored`): each column once, when a frame or `Trace.select` first asks for it. Arrow IPC
compresses each column's buffers apart, so `traceq info`, which names its columns, decodes
5 of the 20 event columns and no op column (~100 MB of the 610 MB the frames take) in
~0.15 CPU s, where decoding every frame took ~0.9 s (2.16M events, a shared machine).
zstd over lz4 or none: those 5 event columns decode in 0.12 CPU s (zstd, 31 MB), 0.12
(lz4, 73 MB) and 0.09 (uncompressed, 867 MB on disk, read from its own file).

**Trust.** Nothing is trusted blindly: an entry whose format or key differs, whose stored
identity is not the file's as found now (another file's entry copied under this key), whose
`meta.json` does not decode to its typed schema (`Meta`: a key missing, a value of the wrong
type), that lacks a table a `Trace` reads, that is truncated or corrupt (bad CRC, no IPC
footer, rows or schema other than `meta.json` says), or that is not a regular file (a FIFO,
which would block the open, a directory, a link, a device: looked at, never opened) is
ignored, removed and rebuilt. Damage that passes those checks (bytes written damaged under
a valid CRC; a `parent` column that is no tree, which would send every walk up the op tree
round a cycle forever, checked when first decoded) shows when a column is decoded: the entry
is removed and the trace is loaded cold again, in the same call, with every frame then the
cold load's; should the file have changed since the hit, the columns read before are of
another trace, and the call fails with one `TraceFileError` line instead. A trace that is
not a regular file (a named pipe) is not cached: identifying it would consume it.

Writers write a temporary file in the same folder and `os.replace` it onto the entry's
name, so a reader sees a whole entry or none, and two processes loading one trace at once
both succeed (the last rename wins; both entries are whole). The folder's size is bounded
(`TRACEQ_CACHE_MAX_BYTES`, default 4 GiB): past it, the least recently used entries go (a
hit refreshes an entry's mtime). A cache folder that cannot be created or written
(read-only, disk full) means no cache, never an error.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata as dist_metadata
from pathlib import Path
from stat import S_ISDIR, S_ISREG
from typing import Any

import msgspec
import polars as pl

from traceq.errors import TraceFileError
from traceq.loader.decode import without_null_storage

# Bump when a frame's columns or meaning change; the source digest below is the safety net.
SCHEMA_VERSION = 2
FORMAT = "traceq-cache-1"
DEFAULT_MAX_BYTES = 4 << 30
SUFFIX = ".traceq.zip"
TMP_PREFIX = ".tmp-"
STALE_TMP_SECONDS = 3600  # a temporary file this old belongs to a process that died
SAMPLE_EDGE = 1 << 20
SAMPLE_PIECE = 64 << 10
SAMPLE_COUNT = 32
# The modules whose code decides what the frames hold.
_FRAME_SOURCES = (
    "loader/decode.py",
    "loader/frames.py",
    "loader/load.py",
    "loader/source.py",
    "pipeline.py",
    "relations/link.py",
    "relations/nesting.py",
)
_PACKAGE = Path(__file__).resolve().parent.parent
# What a decode of damaged bytes raises (a Polars panic is a BaseException).
_DAMAGE = (pl.exceptions.PolarsError, pl.exceptions.PanicException, OSError, ValueError)
# What a cold load gives: the events frame and the typed frames by name.
Tables = tuple[pl.DataFrame, dict[str, pl.DataFrame]]
# The tables a `Trace` reads by name: an entry without one of them is incomplete.
_TABLES = (
    "events",
    "ops",
    "kernels",
    "runtime",
    "annotations",
    "steps",
    "python",
    "modules",
    "flows",
    "syncs",
    "counters",
    "instants",
    "threads",
    "other",
)
# Open an entry without following a link or waiting on a FIFO (POSIX; 0 where absent).
_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_BINARY", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


class Identity(msgspec.Struct, forbid_unknown_fields=True):
    """The facts that identify a trace file, as `meta.json` stores them (see Key)."""

    path: str
    size: int
    mtime_ns: int
    sample_blake2b: str
    schema_version: int
    code: str
    versions: dict[str, str]


class FrameSpec(msgspec.Struct, forbid_unknown_fields=True):
    rows: int
    schema: list[tuple[str, str]]


class Meta(msgspec.Struct, forbid_unknown_fields=True):
    """`meta.json`, typed: an entry whose `meta.json` decodes to anything else is damaged."""

    format: str
    key: str
    identity: Identity
    metadata: dict[str, Any]
    frames: dict[str, FrameSpec]


def enabled(requested: bool | None = None) -> bool:
    """Whether to use the cache: `requested` when given, else unless `TRACEQ_CACHE=0`."""
    if requested is not None:
        return requested
    return os.environ.get("TRACEQ_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def folder() -> Path:
    """The cache folder (not created here)."""
    explicit = os.environ.get("TRACEQ_CACHE_DIR", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    home = Path.home()
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(home / "AppData" / "Local")
        return Path(base) / "traceq" / "Cache"
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / "traceq"
    return Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache") / "traceq"


def max_bytes() -> int:
    """The folder's size limit: `TRACEQ_CACHE_MAX_BYTES`, else 4 GiB (bad values: default)."""
    try:
        return int(os.environ.get("TRACEQ_CACHE_MAX_BYTES", "").strip())
    except ValueError:
        return DEFAULT_MAX_BYTES


@dataclass(frozen=True)
class Entry:
    """Where one file's frames are cached, and the facts that identify the file."""

    path: Path
    key: str
    identity: dict[str, Any]


def entry_for(src: str | os.PathLike[str]) -> Entry | None:
    """The cache entry of a trace file; None when the file cannot be identified, or is not
    a regular file (a pipe, `<(zcat ...)`: sampling would consume what the loader reads)."""
    try:
        path = Path(src).resolve()
        stat = path.stat()
        if not S_ISREG(stat.st_mode):
            return None
        sample = _sample_digest(path, stat.st_size)
    except OSError:
        return None  # missing or unreadable: the loader reports it
    identity = {
        "path": str(path),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sample_blake2b": sample,
        "schema_version": SCHEMA_VERSION,
        "code": _code_digest(),
        "versions": _versions(),
    }
    key = hashlib.blake2b(msgspec.json.encode(identity), digest_size=16).hexdigest()
    return Entry(path=folder() / f"{key}{SUFFIX}", key=key, identity=identity)


def _sample_digest(path: Path, size: int) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with path.open("rb") as f:
        if size <= 2 * SAMPLE_EDGE + SAMPLE_COUNT * SAMPLE_PIECE:
            digest.update(f.read())
        else:
            digest.update(f.read(SAMPLE_EDGE))
            step = (size - 2 * SAMPLE_EDGE) // (SAMPLE_COUNT + 1)
            for i in range(1, SAMPLE_COUNT + 1):
                f.seek(SAMPLE_EDGE + i * step)
                digest.update(f.read(SAMPLE_PIECE))
            f.seek(size - SAMPLE_EDGE)
            digest.update(f.read(SAMPLE_EDGE))
    return digest.hexdigest()


@functools.cache
def _code_digest() -> str:
    """The frame-building code's digest, read once per process."""
    digest = hashlib.blake2b(digest_size=16)
    for name in _FRAME_SOURCES:
        with contextlib.suppress(OSError):
            digest.update((_PACKAGE / name).read_bytes())
    return digest.hexdigest()


def _versions() -> dict[str, str]:
    versions = {"polars": pl.__version__, "msgspec": msgspec.__version__}
    with contextlib.suppress(dist_metadata.PackageNotFoundError):
        versions["traceq"] = dist_metadata.version("traceq")
    return versions


class Stored(Mapping[str, pl.DataFrame]):
    """A cache entry's frames, each column decoded when first asked for and kept: `select`
    decodes the columns it names, a frame (`stored["ops"]`, `events()`) the rest of its
    own. `traceq info` on the 2.16M-event trace needs 5 of the 20 event columns (60 MB of
    340 MB decoded) and none of `ops`' 20: ~100 MB of the 610 MB the frames take.

    A Mapping of the typed frames by name, like the dict a cold load gives; `events()` is
    the events frame. Everything it decodes was verified by `read` first (every member's
    CRC-32, every frame's schema and rows from its IPC footer), so a decode that still
    fails, or a `parent` column that is no tree (`tree_fault`, checked on its first
    decode), is an entry damaged past what a CRC sees: the entry is removed and `rebuild`
    (the cold load) gives every frame instead, never a traceback or a wrong frame.
    """

    def __init__(
        self,
        entry: Entry,
        metadata: dict[str, Any],
        blobs: dict[str, bytes],
        columns: dict[str, list[str]],
        rebuild: Callable[[], Tables],
    ) -> None:
        self.entry = entry
        self.metadata = metadata
        self._blobs = blobs  # table name ("events" among them) -> verified Arrow IPC bytes
        self._columns = columns  # table name -> its column names, in order
        self._names = [name for name in blobs if name != "events"]
        self._read: dict[str, dict[str, pl.Series]] = {name: {} for name in blobs}
        self._whole: dict[str, pl.DataFrame] = {}
        self._rebuild = rebuild

    def __getitem__(self, name: str) -> pl.DataFrame:
        if name not in self._names:
            raise KeyError(name)
        return self.table(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names  # without decoding the frame, as Mapping's would

    def events(self) -> pl.DataFrame:
        return self.table("events")

    def table(self, name: str) -> pl.DataFrame:
        """Table `name` ("events" or a frame), whole."""
        frame = self._whole.get(name)
        if frame is None:
            frame = without_null_storage(self.select(name, self._columns[name]))
            self._whole[name] = frame
            self._read.pop(name, None)  # its columns live on in the frame,
            self._blobs.pop(name, None)  # which answers every later question
        return frame

    def select(self, name: str, columns: Sequence[str]) -> pl.DataFrame:
        """Table `name` with only `columns`; only the columns not decoded yet are read from
        its IPC bytes (Arrow IPC decompresses each column's buffers apart)."""
        whole = self._whole.get(name)
        if whole is not None:
            return whole.select(columns)
        if name not in self._columns:
            raise KeyError(name)
        unknown = [column for column in columns if column not in self._columns[name]]
        if unknown:
            raise pl.exceptions.ColumnNotFoundError(f"{name} has no column {unknown[0]!r}")
        read = self._read[name]
        missing = [column for column in columns if column not in read]
        tree = "parent" in missing and "event" in self._columns[name]
        if tree and "event" not in read and "event" not in missing:
            missing.append("event")  # the parents are checked against the events
        if missing:
            try:
                read.update(pl.read_ipc(self._blobs[name], columns=missing).to_dict())
                if tree and (fault := tree_fault(read["event"], read["parent"])):
                    raise ValueError(f"{name}: {fault}")
            except _DAMAGE:
                self._rebuilt()
                return self._whole[name].select(columns)
        return pl.DataFrame([read[column] for column in columns])

    def _rebuilt(self) -> None:
        """Replace every table by the cold load's, once the entry proved damaged; unless the
        file changed since: what was decoded already is of the file as it was then."""
        _remove(self.entry.path)  # nothing of it is trusted any more
        again = entry_for(self.entry.identity["path"])
        if again is None or again.key != self.entry.key:
            raise TraceFileError(
                f"{self.entry.identity['path']} changed after it was loaded, and its cached "
                "frames proved damaged: load it again"
            )
        events, frames = self._rebuild()
        self._whole = {"events": events, **frames}
        self._read, self._blobs = {}, {}


def read(entry: Entry, rebuild: Callable[[], Tables]) -> Stored | None:
    """The entry's frames, verified and ready to decode, or None on a miss; a damaged or
    foreign entry is removed. `rebuild` loads the trace cold, should a frame that passed
    every check here still fail to decode (see `Stored`).

    Verifying reads every member (~60 MB for the 2.16M-event trace, CRC-32 by `zipfile`)
    and each frame's IPC footer: tens of milliseconds, against about a second to decode it
    all, which is left to first use."""
    try:
        with _opened(entry.path) as f, zipfile.ZipFile(f) as archive:
            meta = _meta(archive, entry)
            blobs = {name: _verified(archive, name, spec) for name, spec in meta.frames.items()}
            with contextlib.suppress(OSError):  # least recently used is evicted first
                os.utime(f.fileno() if os.utime in os.supports_fd else entry.path)
    except FileNotFoundError:
        return None
    except (Exception, pl.exceptions.PanicException):  # any damage at all means: rebuild
        _discard(entry.path)
        return None
    columns = {name: [column for column, _ in spec.schema] for name, spec in meta.frames.items()}
    return Stored(entry, meta.metadata, blobs, columns, rebuild)


def _opened(path: Path) -> io.BufferedReader:
    """The entry at `path`, open for reading, if it is a regular file. Never a link (the
    cache writes none), a FIFO (opening one to read waits for a writer: forever), a
    directory or a device: those are looked at (`lstat`), not opened; and what is opened,
    without following a link or waiting, is checked again (`fstat`), as the name may have
    been replaced in between."""
    if not S_ISREG(path.lstat().st_mode):
        raise ValueError(f"{path} is not a regular file")
    fd = os.open(path, _OPEN_FLAGS)
    try:
        if not S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _meta(archive: zipfile.ZipFile, entry: Entry) -> Meta:
    """`meta.json`, once it is of this format, of this key, of this very file (the identity
    it stores is the one `entry_for` found just now: an entry copied under another file's
    key is not that file's), and lists every table a `Trace` reads. Its members are stored,
    not compressed, as `write` stores them: none can inflate past the entry's own size."""
    if any(info.compress_type != zipfile.ZIP_STORED for info in archive.infolist()):
        raise ValueError("a compressed member")
    meta = msgspec.json.decode(archive.read("meta.json"), type=Meta)
    if meta.format != FORMAT or meta.key != entry.key:
        raise ValueError("another format or key")
    if msgspec.to_builtins(meta.identity) != entry.identity:
        raise ValueError("another file's entry")
    if not meta.frames.keys() >= set(_TABLES):
        raise ValueError("a table missing")
    return meta


def _verified(archive: zipfile.ZipFile, name: str, spec: FrameSpec) -> bytes:
    """A frame's IPC bytes (`ZipFile` checks the CRC-32), once its footer says the schema and
    rows `meta.json` recorded; decoding nothing."""
    blob = archive.read(f"{name}.arrow")
    frame = pl.scan_ipc(blob)
    schema = [(column, str(dtype)) for column, dtype in frame.collect_schema().items()]
    if schema != spec.schema or frame.select(pl.len()).collect().item() != spec.rows:
        raise ValueError(f"frame {name} is not what meta.json says")
    return blob


def tree_fault(event: pl.Series, parent: pl.Series) -> str | None:
    """What keeps a frame's `parent` column (event ids) from being a tree, or None.

    A cold load nests ops and modules by time (`relations.nesting`): each parent is another
    row of the same frame, whose events are in increasing order, and following parents
    ends. A cached frame is checked, when its `parent` column is first decoded: a cycle (an
    op its own parent) would make every walk up the tree (`analyze`'s rules,
    `Trace.kernels_under`) loop forever, and a parent that is no row of the frame breaks
    the walks that find it by position.

    Parents that all come before their children (the rule, as a trace lists an op's start
    before its children's) can form no cycle: ~2 ms for 109k ops. Otherwise, pointer
    doubling: each step doubles how far up every row's ancestor is, so a tree of depth d
    takes log2(d) gathers (~20 ms more), and an ancestor still there past `len` steps is on
    a cycle."""
    n = event.len()
    if n == 0:
        return None if parent.null_count() == parent.len() else "parents of no rows"
    event, parent = event.cast(pl.Int64), parent.cast(pl.Int64)
    if not (event.diff() > 0).all():
        return "events not in increasing order"
    if not parent.drop_nulls().is_in(event.implode()).all():
        return "a parent that is no row of the frame"
    if (parent < event).all():  # nulls aside
        return None
    has = parent.is_not_null()
    up = event.search_sorted(parent).set(~has, None)  # each row's ancestor `steps` up
    steps = 1
    while up.null_count() < n:
        if steps >= n:
            return "a cycle of parents"
        up = up.gather(up)
        steps *= 2
    return None


def _schema_text(frame: pl.DataFrame) -> list[list[str]]:
    return [[name, str(dtype)] for name, dtype in frame.schema.items()]


def write(
    entry: Entry, metadata: dict[str, Any], events: pl.DataFrame, frames: dict[str, pl.DataFrame]
) -> bool:
    """Store a loaded trace; False (and nothing left behind) when the folder refuses it."""
    root = entry.path.parent
    tmp: Path | None = None
    again = entry_for(entry.identity["path"])
    if again is None or again.key != entry.key:
        return False  # the file changed while it was read: these frames are of neither
    try:
        root.mkdir(parents=True, exist_ok=True)
        blobs = {name: _ipc(frame) for name, frame in {"events": events, **frames}.items()}
        meta = {
            "format": FORMAT,
            "key": entry.key,
            "identity": entry.identity,
            "metadata": metadata,
            "frames": {
                name: {"rows": frame.height, "schema": _schema_text(frame)}
                for name, frame in {"events": events, **frames}.items()
            },
        }
        limit = max_bytes()
        if sum(len(b) for b in blobs.values()) > limit:
            return False
        handle, name = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=SUFFIX, dir=root)
        tmp = Path(name)
        with os.fdopen(handle, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as archive:
            archive.writestr("meta.json", msgspec.json.encode(meta))
            for frame_name, blob in blobs.items():
                archive.writestr(f"{frame_name}.arrow", blob)
        os.replace(tmp, entry.path)
        tmp = None
        evict(limit, keep=entry.path)
        return True
    except (OSError, pl.exceptions.PolarsError, msgspec.EncodeError):
        return False  # read-only, full, or gone: the trace loads without a cache
    finally:
        if tmp is not None:
            _remove(tmp)


def _ipc(frame: pl.DataFrame) -> bytes:
    buffer = io.BytesIO()
    frame.write_ipc(buffer, compression="zstd")
    return buffer.getvalue()


def entries(root: Path | None = None) -> list[tuple[Path, os.stat_result]]:
    """(path, stat) of every entry, least recently used first."""
    root = folder() if root is None else root
    found = []
    with contextlib.suppress(OSError):
        for path in root.iterdir():
            if path.name.endswith(SUFFIX) and not path.name.startswith(TMP_PREFIX):
                with contextlib.suppress(OSError):
                    found.append((path, path.stat()))
    return sorted(found, key=lambda item: item[1].st_mtime_ns)


def evict(limit: int, *, keep: Path | None = None) -> list[Path]:
    """Remove least recently used entries until the folder holds at most `limit` bytes,
    and temporary files left by processes that died."""
    root = folder() if keep is None else keep.parent
    _remove_stale_tmp(root)
    found = entries(root)
    total = sum(stat.st_size for _, stat in found)
    removed = []
    for path, stat in found:
        if total <= limit:
            break
        if path == keep:
            continue
        _remove(path)
        total -= stat.st_size
        removed.append(path)
    return removed


def _remove_stale_tmp(root: Path) -> None:
    cutoff = time.time() - STALE_TMP_SECONDS
    with contextlib.suppress(OSError):
        for path in root.glob(f"{TMP_PREFIX}*"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()


def clear() -> tuple[int, int]:
    """Remove every entry (and temporary file); returns (entries, bytes) removed."""
    found = entries()
    for path, _ in found:
        _discard(path)
    with contextlib.suppress(OSError):
        for path in folder().glob(f"{TMP_PREFIX}*"):
            _remove(path)
    return len(found), sum(stat.st_size for _, stat in found)


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _discard(path: Path) -> None:
    """Remove what lies at a damaged entry's name, whatever it is: a link (never what it
    points to), a FIFO, a directory, so that the rebuilt entry can take the name."""
    with contextlib.suppress(OSError):
        if S_ISDIR(path.lstat().st_mode):
            shutil.rmtree(path)
        else:
            path.unlink()


def describe() -> Iterator[tuple[str, str]]:
    """Facts for `traceq cache info`."""
    found = entries()
    yield "folder", str(folder())
    yield "enabled", "yes" if enabled() else "no (TRACEQ_CACHE=0)"
    yield "entries", str(len(found))
    yield "size", size_text(sum(stat.st_size for _, stat in found))
    yield "limit", size_text(max_bytes()) + " (TRACEQ_CACHE_MAX_BYTES)"


def size_text(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"
