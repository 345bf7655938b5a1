"""The columnar cache: a hit gives the frames a cold load gives, and nothing else is trusted.

Each test gets its own cache folder (`TRACEQ_CACHE_DIR`) with the cache on; the rest of the
suite runs with it off (tests/conftest.py). Whether a load parsed JSON is seen by counting
calls of the decoder, not by timing.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import msgspec
import polars as pl
import pytest
from click.testing import CliRunner
from conftest import assert_same_trace
from conftest import cache_entries as entries
from polars.testing import assert_frame_equal
from traceq.cli.main import main

import traceq
from traceq.loader import cache as C

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "mlp_gelu-train.pt.trace.json.gz"


def test_second_load_is_a_hit_with_the_frames_of_a_cold_load(
    cache_dir: Path, trace_file: Path, parses: list[int]
) -> None:
    cold = traceq.load(trace_file, cache=False)
    assert parses == [1] and not cache_dir.exists()
    first = traceq.load(trace_file)
    assert parses == [1, 1] and len(entries(cache_dir)) == 1
    hit = traceq.load(trace_file)
    assert parses == [1, 1]  # no JSON parsed
    assert hit.source == str(trace_file)
    assert_same_trace(cold, first)
    assert_same_trace(cold, hit)
    assert hit.unlinked == cold.unlinked
    assert hit.schema == cold.schema and hit.duration_ns == cold.duration_ns
    assert_frame_equal(hit.step_times(), cold.step_times())


def test_relations_and_rules_work_on_a_cached_load(
    cache_dir: Path, tmp_path: Path, parses: list[int]
) -> None:
    source = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
    source = source / "hta/tests/data/df_index_resolver/df_index_resolver.json.gz"
    if not source.exists():
        pytest.skip(f"{source} not present (../shared/traces)")
    path = tmp_path / source.name
    shutil.copyfile(source, path)
    cold = traceq.load(path)
    hit = traceq.load(path)
    assert len(parses) == 1
    assert_same_trace(cold, hit)
    assert cold.kernels.height > 0
    assert_frame_equal(hit.dataflow, cold.dataflow)
    assert hit.graph.number_of_edges() == cold.graph.number_of_edges() > 0
    path, cold_path = hit.critical_path(), cold.critical_path()
    assert_frame_equal(path.nodes, cold_path.nodes)
    assert_frame_equal(path.edges, cold_path.edges)
    assert path.length_ns == cold_path.length_ns > 0
    assert traceq.analyze(hit) == traceq.analyze(cold)


def test_a_changed_file_misses_even_with_its_size_and_mtime_kept(
    cache_dir: Path, trace_file: Path, parses: list[int]
) -> None:
    plain = trace_file.with_suffix("")
    plain.write_bytes(gzip.decompress(trace_file.read_bytes()))
    before = traceq.load(plain)
    stat = plain.stat()
    text = plain.read_bytes()
    assert b'"aten::mm"' in text
    plain.write_bytes(text.replace(b'"aten::mm"', b'"aten::mX"'))  # same size
    os.utime(plain, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same mtime
    assert plain.stat().st_size == stat.st_size and plain.stat().st_mtime_ns == stat.st_mtime_ns
    after = traceq.load(plain)
    assert len(parses) == 2
    assert "aten::mX" in after.ops["name"].to_list()
    assert "aten::mX" not in before.ops["name"].to_list()
    traceq.load(plain)
    assert len(parses) == 2  # and the new content is cached in turn


def test_a_rewrite_inside_a_large_file_between_samples_is_not_seen_but_size_or_mtime_is(
    cache_dir: Path, tmp_path: Path
) -> None:
    """Documents the key's limit: a same-size, same-mtime edit that no sample covers hits.
    Any edit that changes the size or the mtime misses."""
    path = tmp_path / "big.bin"
    data = bytearray(os.urandom(64 << 20))
    path.write_bytes(data)
    key = C.entry_for(path).key
    stat = path.stat()
    gap = C.SAMPLE_EDGE + C.SAMPLE_PIECE + 10  # after the first sample, before the second
    data[gap] ^= 0xFF
    path.write_bytes(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert C.entry_for(path).key == key
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert C.entry_for(path).key != key


def test_another_schema_version_misses(
    cache_dir: Path, trace_file: Path, parses: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    traceq.load(trace_file)
    monkeypatch.setattr(C, "SCHEMA_VERSION", C.SCHEMA_VERSION + 1)
    traceq.load(trace_file)
    assert len(parses) == 2
    assert len(entries(cache_dir)) == 2  # the old one stays until evicted
    traceq.load(trace_file)
    assert len(parses) == 2


def test_an_entry_in_another_format_under_the_right_name_is_rebuilt(
    cache_dir: Path, trace_file: Path, parses: list[int]
) -> None:
    cold = traceq.load(trace_file)
    (entry,) = entries(cache_dir)
    with zipfile.ZipFile(entry) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    meta = msgspec.json.decode(members["meta.json"])
    members["meta.json"] = msgspec.json.encode({**meta, "format": "traceq-cache-0"})
    with zipfile.ZipFile(entry, "w") as archive:
        for name, blob in members.items():
            archive.writestr(name, blob)
    assert_same_trace(cold, traceq.load(trace_file))
    assert len(parses) == 2
    traceq.load(trace_file)
    assert len(parses) == 2  # rebuilt, and trusted again


@pytest.mark.parametrize(
    "damage",
    ["flip a byte in a frame", "truncate", "empty file", "rows differ from meta.json"],
)
def test_a_damaged_entry_is_ignored_and_rebuilt(
    damage: str, cache_dir: Path, trace_file: Path, parses: list[int]
) -> None:
    cold = traceq.load(trace_file)
    (entry,) = entries(cache_dir)
    blob = bytearray(entry.read_bytes())
    if damage == "flip a byte in a frame":
        with zipfile.ZipFile(entry) as archive:
            info = archive.getinfo("ops.arrow")
        at = info.header_offset + 30 + len(info.filename) + info.compress_size // 2
        blob[at] ^= 0x55
    elif damage == "truncate":
        del blob[len(blob) // 2 :]
    elif damage == "empty file":
        blob = bytearray()
    else:
        with zipfile.ZipFile(entry) as archive:
            members = {name: archive.read(name) for name in archive.namelist()}
        members["ops.arrow"] = members["kernels.arrow"]  # a whole, valid, wrong frame
        entry.unlink()
        with zipfile.ZipFile(entry, "w") as archive:
            for name, data in members.items():
                archive.writestr(name, data)
        blob = bytearray(entry.read_bytes())
    entry.write_bytes(blob)
    again = traceq.load(trace_file)
    assert len(parses) == 2
    assert_same_trace(cold, again)
    traceq.load(trace_file)
    assert len(parses) == 2  # the rebuilt entry is whole


def test_two_processes_loading_one_trace_at_once_both_succeed(
    cache_dir: Path, trace_file: Path, parses: list[int]
) -> None:
    script = (
        "import sys, traceq\n"
        "from traceq.loader import cache\n"
        "t = traceq.load(sys.argv[1])\n"
        "print(t.events.height, t.ops.height)\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(trace_file)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    expected = traceq.load(trace_file, cache=False)
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        assert out.split() == [str(expected.events.height), str(expected.ops.height)]
    assert len(entries(cache_dir)) == 1
    assert not list(cache_dir.glob(f"{C.TMP_PREFIX}*"))
    assert_same_trace(expected, traceq.load(trace_file))
    assert len(parses) == 1  # only the reference load above parsed in this process


def test_an_unwritable_cache_folder_means_no_cache_not_an_error(
    cache_dir: Path, trace_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TRACEQ_CACHE_DIR", str(blocker / "cache"))
    assert traceq.load(trace_file).events.height > 0
    assert traceq.load(trace_file).events.height > 0


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores modes")
def test_a_read_only_cache_folder_means_no_cache_not_an_error(
    cache_dir: Path, trace_file: Path
) -> None:
    cache_dir.mkdir()
    cache_dir.chmod(0o555)
    try:
        assert traceq.load(trace_file).events.height > 0
        assert entries(cache_dir) == []
    finally:
        cache_dir.chmod(0o755)


@pytest.mark.parametrize("errno_name", ["EROFS", "ENOSPC"])
def test_a_failing_write_leaves_nothing_and_loads(
    errno_name: str,
    cache_dir: Path,
    trace_file: Path,
    parses: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import errno

    def refuse(*_args: object) -> None:
        raise OSError(getattr(errno, errno_name), os.strerror(getattr(errno, errno_name)))

    monkeypatch.setattr(C.os, "replace", refuse)  # after the temp file was written
    assert traceq.load(trace_file).ops.height > 0
    assert list(cache_dir.iterdir()) == []  # the temporary file went too
    monkeypatch.undo()


def test_disabled_cache_writes_nothing(
    cache_dir: Path, trace_file: Path, parses: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRACEQ_CACHE", "0")
    traceq.load(trace_file)
    traceq.load(trace_file)
    assert len(parses) == 2 and not cache_dir.exists()
    monkeypatch.setenv("TRACEQ_CACHE", "1")
    traceq.load(trace_file, cache=False)
    assert not cache_dir.exists()
    result = CliRunner().invoke(main, ["info", "--no-cache", str(trace_file)])
    assert result.exit_code == 0, result.output
    assert not cache_dir.exists()
    assert os.environ["TRACEQ_CACHE"] == "1"  # --no-cache ends with its command
    result = CliRunner().invoke(main, ["info", str(trace_file)])
    assert result.exit_code == 0 and len(entries(cache_dir)) == 1


def test_file_objects_are_not_cached(cache_dir: Path, trace_file: Path) -> None:
    with trace_file.open("rb") as f:
        traceq.load(f)
    assert not cache_dir.exists()


def test_least_recently_used_entries_go_past_the_limit(
    cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = []
    for i in range(3):
        path = tmp_path / f"t{i}.json.gz"
        shutil.copyfile(FIXTURE, path)
        paths.append(path)
    traceq.load(paths[0])
    (one,) = entries(cache_dir)
    size = one.stat().st_size
    monkeypatch.setenv("TRACEQ_CACHE_MAX_BYTES", str(2 * size + size // 2))
    traceq.load(paths[1])
    os.utime(entries_of(paths[1]), ns=(1, 1))  # t1 now least recently used
    traceq.load(paths[0])  # a hit refreshes t0
    traceq.load(paths[2])  # third entry: over the limit, t1 goes
    assert entries_of(paths[0]).exists() and entries_of(paths[2]).exists()
    assert not entries_of(paths[1]).exists()
    assert len(entries(cache_dir)) == 2


def entries_of(path: Path) -> Path:
    entry = C.entry_for(path)
    assert entry is not None
    return entry.path


def test_cache_info_and_clear(cache_dir: Path, trace_file: Path) -> None:
    traceq.load(trace_file)
    runner = CliRunner()
    info = runner.invoke(main, ["cache", "info"])
    assert info.exit_code == 0
    assert f"folder:   {cache_dir}" in info.output and "entries:  1" in info.output
    cleared = runner.invoke(main, ["cache", "clear"])
    assert cleared.exit_code == 0 and cleared.output.startswith("removed 1 cached trace (")
    assert entries(cache_dir) == []
    assert "entries:  0" in runner.invoke(main, ["cache", "info"]).output


def test_default_folder_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TRACEQ_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if sys.platform not in ("win32", "darwin"):
        assert C.folder() == tmp_path / "traceq"
    monkeypatch.setenv("TRACEQ_CACHE_DIR", str(tmp_path / "x"))
    assert C.folder() == tmp_path / "x"


def test_frames_keep_their_dtypes_through_the_cache(cache_dir: Path, trace_file: Path) -> None:
    cold = traceq.load(trace_file)
    hit = traceq.load(trace_file)
    assert hit.ops.schema == cold.ops.schema
    assert hit.ops.schema["shapes"] == pl.List(pl.List(pl.Int64))


GPU_FIXTURE = FIXTURE.parent / "gpu" / "hta-alexnet-a100.json.gz"  # HTA's, MIT (sources.json)


def rewritten(entry: Path, change: dict[str, bytes]) -> None:
    """Rewrite an entry with some members replaced: every CRC-32 is valid again, so only
    what lies past the CRC (the frame's own bytes) is damaged."""
    with zipfile.ZipFile(entry) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    entry.unlink()
    with zipfile.ZipFile(entry, "w") as archive:
        for name, blob in {**members, **change}.items():
            archive.writestr(name, blob)


def undecodable(blob: bytes) -> bytes:
    """An IPC file whose footer (schema, rows) is intact and whose every zstd-compressed
    buffer fails to decode: each zstd frame's magic number is changed."""
    magic = b"\x28\xb5\x2f\xfd"
    assert blob.count(magic) > 0
    return blob.replace(magic, b"\x28\xb5\x2f\xfe")


def member(entry: Path, name: str) -> bytes:
    with zipfile.ZipFile(entry) as archive:
        return archive.read(name)


@pytest.mark.parametrize("fixture", [FIXTURE, GPU_FIXTURE], ids=["cpu", "gpu"])
def test_info_of_a_hit_is_info_of_a_cold_load(
    fixture: Path, cache_dir: Path, tmp_path: Path, parses: list[int]
) -> None:
    path = tmp_path / fixture.name
    shutil.copyfile(fixture, path)
    runner = CliRunner()
    cold = runner.invoke(main, ["info", "--no-cache", "--format", "json", str(path)])
    first = runner.invoke(main, ["info", "--format", "json", str(path)])
    hit = runner.invoke(main, ["info", "--format", "json", str(path)])
    assert cold.exit_code == first.exit_code == hit.exit_code == 0, hit.output
    assert len(parses) == 2  # the cold load and the one that wrote the entry
    assert msgspec.json.decode(hit.output) == msgspec.json.decode(cold.output)
    assert msgspec.json.decode(first.output) == msgspec.json.decode(cold.output)
    if fixture == GPU_FIXTURE:
        assert msgspec.json.decode(hit.output)["devices"]  # the per-device rows are compared


def test_info_of_a_hit_decodes_only_the_columns_it_reads(
    cache_dir: Path, trace_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    traceq.load(trace_file)
    decoded: list[tuple[str, tuple[str, ...]]] = []
    whole: list[str] = []
    select, table = C.Stored.select, C.Stored.table

    def spy_select(self: C.Stored, name: str, columns: list[str]) -> pl.DataFrame:
        decoded.append((name, tuple(columns)))
        return select(self, name, columns)

    def spy_table(self: C.Stored, name: str) -> pl.DataFrame:
        whole.append(name)
        return table(self, name)

    monkeypatch.setattr(C.Stored, "select", spy_select)
    monkeypatch.setattr(C.Stored, "table", spy_table)
    result = CliRunner().invoke(main, ["info", str(trace_file)])
    assert result.exit_code == 0, result.output
    assert whole == []  # no frame decoded whole, `events` least of all
    events = {column for name, columns in decoded if name == "events" for column in columns}
    assert events == {"event", "cat", "ph", "ts_ns", "dur_ns"}  # not `args`, `name`, ...


def test_a_hit_decodes_each_column_once_and_gives_the_frames_of_a_cold_load(
    cache_dir: Path, trace_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cold = traceq.load(trace_file, cache=False)
    traceq.load(trace_file)
    hit = traceq.load(trace_file)
    reads: list[list[str] | None] = []
    read_ipc = pl.read_ipc

    def counting(source: bytes, *, columns: list[str] | None = None) -> pl.DataFrame:
        reads.append(columns)
        return read_ipc(source, columns=columns)

    monkeypatch.setattr(C.pl, "read_ipc", counting)
    assert_frame_equal(hit.select("ops", "name", "ts_ns"), cold.ops.select("name", "ts_ns"))
    assert_frame_equal(hit.select("ops", "ts_ns"), cold.ops.select("ts_ns"))
    assert reads == [["name", "ts_ns"]]  # the second select decoded nothing
    assert_frame_equal(hit.ops, cold.ops, check_exact=True)
    assert reads[1:] == [[c for c in cold.ops.columns if c not in ("name", "ts_ns")]]
    assert hit.ops is hit.ops and hit.events is hit.events
    before = len(reads)
    assert "kernels" in hit.frames and "events" not in hit.frames
    assert len(reads) == before  # asking which frames there are decodes none
    with pytest.raises(pl.exceptions.ColumnNotFoundError):
        hit.select("kernels", "no_such_column")
    monkeypatch.undo()
    assert_same_trace(cold, hit)


@pytest.mark.parametrize("first_use", ["a whole frame", "some columns", "the events"])
def test_a_frame_damaged_past_its_crc_is_rebuilt_when_first_decoded(
    first_use: str, cache_dir: Path, trace_file: Path, parses: list[int]
) -> None:
    """The lazy path: the entry passes every check at load (CRC-32s, footers' schema and
    rows), and its frames fail only when decoded; that is a rebuild, not a traceback."""
    cold = traceq.load(trace_file)
    (entry,) = entries(cache_dir)
    name = "events" if first_use == "the events" else "ops"
    rewritten(entry, {f"{name}.arrow": undecodable(member(entry, f"{name}.arrow"))})
    hit = traceq.load(trace_file)
    # The events' Categorical columns (`ph`, `cat`, ...) carry dictionary batches, which
    # verifying the footer reads: damage there is found at load, and rebuilt then.
    found_at_load = name == "events"
    assert len(parses) == 1 + found_at_load  # else verified and trusted: nothing decoded yet
    if first_use == "a whole frame":
        assert_frame_equal(hit.ops, cold.ops, check_exact=True)
    elif first_use == "some columns":
        assert_frame_equal(hit.select("ops", "name"), cold.ops.select("name"))
    else:
        assert_frame_equal(hit.events, cold.events)
    assert len(parses) == 2  # the damage was found, and the trace loaded cold again
    assert_same_trace(cold, hit)
    assert len(parses) == 2  # every frame now is the rebuild's
    (again,) = entries(cache_dir)  # the damaged entry was replaced by the rebuild's
    frame = pl.read_ipc(member(again, f"{name}.arrow"))
    assert_frame_equal(frame, cold.events if name == "events" else cold.ops, check_exact=True)
    assert_same_trace(cold, traceq.load(trace_file))
    assert len(parses) == 2  # the rebuilt entry is whole and trusted


def test_a_frame_truncated_inside_a_whole_zip_is_found_at_load(
    cache_dir: Path, trace_file: Path, parses: list[int]
) -> None:
    """A truncated frame file under a valid CRC (it was written truncated) has no IPC footer:
    `read` sees it before anything is decoded, and the trace loads cold."""
    cold = traceq.load(trace_file)
    (entry,) = entries(cache_dir)
    blob = member(entry, "kernels.arrow")
    rewritten(entry, {"kernels.arrow": blob[: len(blob) // 2]})
    again = traceq.load(trace_file)
    assert len(parses) == 2
    assert_same_trace(cold, again)


def test_info_on_an_entry_damaged_past_its_crc_prints_the_cold_answer(
    cache_dir: Path, trace_file: Path
) -> None:
    runner = CliRunner()
    cold = runner.invoke(main, ["info", "--no-cache", "--format", "json", str(trace_file)])
    traceq.load(trace_file)
    (entry,) = entries(cache_dir)
    damage = {
        f"{name}.arrow": undecodable(member(entry, f"{name}.arrow")) for name in ("events", "ops")
    }
    rewritten(entry, damage)
    result = runner.invoke(main, ["info", "--format", "json", str(trace_file)])
    assert result.exit_code == 0 and result.exception is None, result.output
    assert msgspec.json.decode(result.output) == msgspec.json.decode(cold.output)


def test_damage_found_after_the_trace_changed_is_one_error_line(
    cache_dir: Path, trace_file: Path
) -> None:
    """The columns decoded before are of the file as it was: rebuilding from the changed
    file would mix two traces, so the command stops with one line (exit 2)."""
    traceq.load(trace_file)
    (entry,) = entries(cache_dir)
    rewritten(entry, {"ops.arrow": undecodable(member(entry, "ops.arrow"))})
    hit = traceq.load(trace_file)
    hit.select("events", "cat")
    os.utime(trace_file, ns=(1, 1))
    with pytest.raises(traceq.TraceFileError, match="changed after it was loaded"):
        hit.ops  # noqa: B018


def test_a_cached_trace_pickles_with_its_frames(cache_dir: Path, trace_file: Path) -> None:
    """What a process pool sends: the frames, decoded, not the reader of this process's cache."""
    import pickle

    cold = traceq.load(trace_file, cache=False)
    traceq.load(trace_file)
    hit = traceq.load(trace_file)
    copy = pickle.loads(pickle.dumps(hit))
    assert isinstance(copy.frames, dict)
    assert copy.source == hit.source
    assert_same_trace(cold, copy)
    assert copy.unlinked == cold.unlinked
