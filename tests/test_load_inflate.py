"""The gzip reader inflates with ISA-L (`isal`) when it is installed and with the standard
library's zlib otherwise: both must give the same bytes and the same one-line errors, on
multi-member streams with padding, truncated and corrupt streams, a bad checksum, and the
bomb guard."""

from __future__ import annotations

import builtins
import gzip
import zlib
from pathlib import Path
from types import ModuleType

import pytest

from traceq.errors import TraceFileError, TraceTooLargeError
from traceq.loader import source
from traceq.loader.source import read_bytes

isal_zlib = pytest.importorskip("isal.isal_zlib", reason="isal is not installed here")
INFLATERS = {"isal": isal_zlib, "zlib": zlib}
EVENT = b'{"ph": "X", "name": "k%d", "ts": %d, "dur": 1},\n'
DATA = b"".join(EVENT % (i, i) for i in range(50_000))


@pytest.fixture(params=sorted(INFLATERS))
def inflater(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = INFLATERS[request.param]
    monkeypatch.setattr(source, "inflate", module)
    return module


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "t.json.gz"
    path.write_bytes(data)
    return path


def test_members_and_padding_inflate_to_the_same_bytes(
    tmp_path: Path, inflater: ModuleType
) -> None:
    third = len(DATA) // 3
    packed = (
        gzip.compress(DATA[:third])
        + b"\0" * 7
        + gzip.compress(DATA[third : 2 * third], compresslevel=1)
        + gzip.compress(DATA[2 * third :])
        + b"\0\0"
    )
    assert read_bytes(_write(tmp_path, packed)) == DATA


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda packed: packed[:-12], "truncated gzip stream"),
        (lambda packed: packed[:40] + b"\xff" * 8 + packed[48:], "corrupt gzip data"),
        (lambda packed: packed[:-8] + bytes([packed[-8] ^ 0xFF]) + packed[-7:], "corrupt gzip"),
    ],
    ids=["truncated", "corrupt", "checksum"],
)
def test_damaged_streams_give_the_same_one_line_error(
    tmp_path: Path, inflater: ModuleType, damage, message: str
) -> None:
    path = _write(tmp_path, damage(gzip.compress(DATA)))
    with pytest.raises(TraceFileError, match=message) as raised:
        read_bytes(path)
    assert "\n" not in str(raised.value)


def test_the_bomb_guard_stops_either_inflater(tmp_path: Path, inflater: ModuleType) -> None:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    member = packer.compress(bytes(1 << 20)) + packer.flush()
    path = _write(tmp_path, member * 300)  # 300 MiB of zeros in ~300 KB
    with pytest.raises(TraceTooLargeError):
        read_bytes(path)


def test_without_isal_the_standard_library_inflates(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_isal(name: str, *args, **kwargs):
        if name == "isal" or name.startswith("isal."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_isal)
    assert source._inflater() is zlib
    monkeypatch.undo()
    assert source._inflater() is isal_zlib
