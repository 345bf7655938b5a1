"""A cache entry someone else wrote: whatever lies at an entry's name, the load gives the
frames of a cold load, never another file's, never a traceback, never a hang, and the entry
is rebuilt.

Each test gets its own cache folder (`TRACEQ_CACHE_DIR`, the `cache_dir` fixture). What
could hang on a bad entry (a FIFO to open, a parent cycle to walk) runs in a subprocess under
a timeout, so that a regression fails the test instead of stalling the suite.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import msgspec
import polars as pl
import pytest
from conftest import assert_same_trace
from conftest import cache_entries as entries
from polars.testing import assert_frame_equal

import traceq
from traceq.loader import cache as C

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TRAIN = FIXTURES / "mlp_gelu-train.pt.trace.json.gz"
EAGER = FIXTURES / "mlp_gelu-eager.pt.trace.json.gz"
HANG_S = 90  # a cold load and `analyze` of a small trace take ~3 s in a fresh process


def members(entry: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(entry) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def rewritten(entry: Path, change: dict[str, bytes | None]) -> None:
    """The entry with some members replaced (None: left out), every CRC-32 valid."""
    found = {**members(entry), **change}
    entry.unlink()
    with zipfile.ZipFile(entry, "w") as archive:
        for name, blob in found.items():
            if blob is not None:
                archive.writestr(name, blob)


def meta_of(entry: Path) -> dict:
    return msgspec.json.decode(members(entry)["meta.json"])


def assert_rebuilt(entry: Path, source: Path) -> None:
    """`entry` is again a regular file the cache wrote for `source`, with its cold frames."""
    assert stat.S_ISREG(entry.lstat().st_mode)
    meta = meta_of(entry)
    assert meta["identity"] == C.entry_for(source).identity
    cold = traceq.load(source, cache=False)
    found = members(entry)
    for name in ("events", *cold.frames):
        frame = cold.events if name == "events" else cold.frames[name]
        assert_frame_equal(pl.read_ipc(found[f"{name}.arrow"]), frame, check_exact=True)


def run_load(source: Path, *, analyze: bool = False, reference: Path | None = None) -> None:
    """Load `source` through the cache in a fresh process, compare it with a cold load of
    `reference` (default: `source`) and `analyze`'s findings on both, and fail unless that
    ends within `HANG_S` seconds."""
    script = f"""
import sys, traceq
from polars.testing import assert_frame_equal
hit, cold = traceq.load(sys.argv[1]), traceq.load(sys.argv[2], cache=False)
if {analyze!r}:  # first: on a frame the hit had not decoded yet
    assert traceq.analyze(hit) == traceq.analyze(cold)
assert hit.metadata == cold.metadata
assert hit.frames.keys() == cold.frames.keys()
assert_frame_equal(hit.events, cold.events, check_exact=True)
for name in cold.frames:
    assert_frame_equal(hit.frames[name], cold.frames[name], check_exact=True)
print("same")
"""
    try:
        done = subprocess.run(
            [sys.executable, "-c", script, str(source), str(reference or source)],
            capture_output=True,
            text=True,
            timeout=HANG_S,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the load hung: no answer in {HANG_S} s")
    assert done.returncode == 0 and done.stdout.strip() == "same", done.stderr[-3000:]


# --- another file's entry --------------------------------------------------------------


def test_another_files_entry_under_this_files_key_is_ignored_and_rebuilt(
    cache_dir: Path, tmp_path: Path, parses: list[int]
) -> None:
    """A's entry copied onto B's name, its `key` made B's: the stored identity is A's, so B
    loads cold (and is cached in turn) instead of answering with A's frames."""
    a, b = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    shutil.copyfile(TRAIN, a)
    shutil.copyfile(EAGER, b)
    cold_b = traceq.load(b, cache=False)
    traceq.load(a)
    traceq.load(b)
    entry_a, entry_b = C.entry_for(a), C.entry_for(b)
    assert entry_a is not None and entry_b is not None
    shutil.copyfile(entry_a.path, entry_b.path)
    forged = {**meta_of(entry_b.path), "key": entry_b.key}
    rewritten(entry_b.path, {"meta.json": msgspec.json.encode(forged)})
    assert len(parses) == 3
    assert_same_trace(traceq.load(b), cold_b)
    assert len(parses) == 4  # not a hit: loaded cold
    assert_rebuilt(entry_b.path, b)
    before = len(parses)
    traceq.load(b)
    assert len(parses) == before  # the rebuilt entry is trusted again


# --- meta.json -------------------------------------------------------------------------


def _drop(key: str) -> Callable[[dict], dict]:
    return lambda meta: {k: v for k, v in meta.items() if k != key}


def _set(key: str, value: object) -> Callable[[dict], dict]:
    return lambda meta: {**meta, key: value}


def _frames(change: Callable[[dict], dict]) -> Callable[[dict], dict]:
    return lambda meta: {**meta, "frames": change(meta["frames"])}


META_DAMAGE: dict[str, Callable[[dict], dict] | bytes] = {
    "no metadata": _drop("metadata"),
    "no identity": _drop("identity"),
    "no frames": _drop("frames"),
    "metadata not an object": _set("metadata", "not an object"),
    "identity not an object": _set("identity", ["path"]),
    "identity size a string": lambda meta: {
        **meta,
        "identity": {**meta["identity"], "size": str(meta["identity"]["size"])},
    },
    "frames missing ops": _frames(lambda frames: {k: v for k, v in frames.items() if k != "ops"}),
    "frames missing events": _frames(
        lambda frames: {k: v for k, v in frames.items() if k != "events"}
    ),
    "rows a string": _frames(
        lambda frames: {**frames, "ops": {**frames["ops"], "rows": str(frames["ops"]["rows"])}}
    ),
    "schema pairs of one": _frames(
        lambda frames: {
            **frames,
            "ops": {**frames["ops"], "schema": [[c] for c, _ in frames["ops"]["schema"]]},
        }
    ),
    "a JSON array": lambda meta: [meta],  # type: ignore[dict-item]
    "garbage bytes": b"\x00\xffnot json at all\x9c",
    "empty": b"",
}


@pytest.mark.parametrize("damage", list(META_DAMAGE))
def test_a_meta_json_of_the_wrong_shape_is_ignored_and_rebuilt(
    damage: str, cache_dir: Path, trace_file: Path, parses: list[int]
) -> None:
    cold = traceq.load(trace_file, cache=False)
    traceq.load(trace_file)
    (entry,) = entries(cache_dir)
    change = META_DAMAGE[damage]
    blob = change if isinstance(change, bytes) else msgspec.json.encode(change(meta_of(entry)))
    dropped = {"ops.arrow": None} if damage == "frames missing ops" else {}
    rewritten(entry, {"meta.json": blob, **dropped})
    assert len(parses) == 2
    again = traceq.load(trace_file)
    assert_same_trace(again, cold)  # every frame, `ops` and `metadata` among them
    assert len(parses) == 3  # loaded cold
    assert_rebuilt(entry, trace_file)
    before = len(parses)
    traceq.load(trace_file)
    assert len(parses) == before  # and the rebuilt entry is a hit


# --- parent cycles in a cached frame ---------------------------------------------------


def _self_parent(frame: pl.DataFrame) -> pl.DataFrame:
    """The op most others nest in (a root) made its own parent."""
    top = frame["parent"].drop_nulls().mode().sort()[0]
    return frame.with_columns(
        pl.when(pl.col("event") == top)
        .then(pl.col("event").cast(pl.Int64))
        .otherwise("parent")
        .alias("parent")
    )


def _two_cycle(frame: pl.DataFrame) -> pl.DataFrame:
    """That root made the child of one of its own children."""
    top = frame["parent"].drop_nulls().mode().sort()[0]
    child = frame.filter(pl.col("parent") == top)["event"][0]
    return frame.with_columns(
        pl.when(pl.col("event") == top)
        .then(pl.lit(child, pl.Int64))
        .otherwise("parent")
        .alias("parent")
    )


def _foreign_parent(frame: pl.DataFrame) -> pl.DataFrame:
    """Every child's parent an event no row of the frame has."""
    beyond = int(frame["event"].max()) + 1_000
    return frame.with_columns(
        pl.when(pl.col("parent").is_not_null())
        .then(pl.lit(beyond, pl.Int64))
        .otherwise("parent")
        .alias("parent")
    )


TREE_DAMAGE = {
    "an op its own parent": ("ops", _self_parent),
    "two ops each other's parent": ("ops", _two_cycle),
    "a module its own parent": ("modules", _self_parent),
    "ops whose parent is no op": ("ops", _foreign_parent),
}


@pytest.mark.parametrize("damage", list(TREE_DAMAGE))
def test_a_cached_frame_whose_parents_form_a_cycle_is_rebuilt_and_analyze_ends(
    damage: str, cache_dir: Path, trace_file: Path
) -> None:
    """A cycle would make every walk up the op tree (`analyze`'s rules, `kernels_under`)
    loop forever. The frame is whole and decodes: the tree is checked when its `parent`
    column is first decoded, and the trace is loaded cold then."""
    traceq.load(trace_file)
    (entry,) = entries(cache_dir)
    name, change = TREE_DAMAGE[damage]
    frame = pl.read_ipc(members(entry)[f"{name}.arrow"])
    assert frame["parent"].null_count() < frame.height
    buffer = io.BytesIO()
    change(frame).write_ipc(buffer, compression="zstd")
    rewritten(entry, {f"{name}.arrow": buffer.getvalue()})
    run_load(trace_file, analyze=True)
    assert_rebuilt(entry, trace_file)


# A trace whose ops are listed after some of their children: the check's longer path.
PARENTS_AFTER = (
    Path(__file__).resolve().parent.parent.parent
    / "shared/traces/hta/tests/data/trace_diff/control/control.json.gz"
)


@pytest.mark.parametrize(
    "fixture",
    [TRAIN, EAGER, FIXTURES / "corpus" / "llama.pt.trace.json.gz", PARENTS_AFTER],
    ids=["train", "eager", "llama", "parents-after-children"],
)
def test_the_tree_check_accepts_the_frames_of_a_cold_load(
    fixture: Path, cache_dir: Path, tmp_path: Path, parses: list[int]
) -> None:
    """No false alarm: decoding a hit's trees parses nothing."""
    if not fixture.exists():
        pytest.skip(f"{fixture} not present (../shared/traces)")
    path = tmp_path / fixture.name
    shutil.copyfile(fixture, path)
    traceq.load(path)
    hit = traceq.load(path)
    for name in ("ops", "modules"):
        frame = hit.frames[name]  # decoded: its tree is checked
        assert C.tree_fault(frame["event"], frame["parent"]) is None
    assert len(parses) == 1
    assert_same_trace(hit, traceq.load(path, cache=False))


# --- not a regular file ----------------------------------------------------------------


def _fifo(entry: Path, tmp_path: Path) -> None:
    os.mkfifo(entry)


def _directory(entry: Path, tmp_path: Path) -> None:
    entry.mkdir()
    (entry / "meta.json").write_bytes(b"{}")


def _link_to_dev_zero(entry: Path, tmp_path: Path) -> None:
    entry.symlink_to("/dev/zero")


def _link_to_a_fifo(entry: Path, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "elsewhere.fifo")
    entry.symlink_to(tmp_path / "elsewhere.fifo")


def _link_to_a_copy(entry: Path, tmp_path: Path) -> None:
    """A link to a whole, valid copy of the entry outside the cache folder: the cache writes
    no links, so this one is not its own either."""
    outside = tmp_path / "outside.traceq.zip"
    outside.write_bytes(entry.read_bytes())
    entry.unlink()
    entry.symlink_to(outside)


NOT_A_FILE = {
    "a FIFO": _fifo,
    "a directory": _directory,
    "a link to /dev/zero": _link_to_dev_zero,
    "a link to a FIFO elsewhere": _link_to_a_fifo,
    "a link to a copy elsewhere": _link_to_a_copy,
}


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("kind", list(NOT_A_FILE))
def test_an_entry_that_is_not_a_regular_file_is_never_opened_and_is_rebuilt(
    kind: str, cache_dir: Path, trace_file: Path, tmp_path: Path
) -> None:
    traceq.load(trace_file)
    (entry,) = entries(cache_dir)
    whole = entry.read_bytes()
    if kind != "a link to a copy elsewhere":
        entry.unlink()
    NOT_A_FILE[kind](entry, tmp_path)
    run_load(trace_file)  # a FIFO opened for reading would block until a writer came
    assert_rebuilt(entry, trace_file)
    if kind == "a link to a copy elsewhere":
        assert (tmp_path / "outside.traceq.zip").read_bytes() == whole  # left alone


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_trace_read_from_a_fifo_loads_once_and_is_not_cached(
    cache_dir: Path, tmp_path: Path
) -> None:
    """Identifying a FIFO for the cache would read (consume) its bytes, and the load would
    then wait for a second writer forever: a trace that is not a regular file is not cached."""
    fifo = tmp_path / "trace.json.gz"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", 'cat "$1" > "$2"', "sh", str(TRAIN), str(fifo)])
    try:
        run_load(fifo, reference=TRAIN)
    finally:
        writer.kill()
        writer.wait()
    assert entries(cache_dir) == []
