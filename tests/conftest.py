"""Shared test fixtures: where the traces are, and each trace loaded once per session.

Three sets of traces feed the tests:
- `fixtures/*.pt.trace.json.gz`: small CPU traces this project records itself
  (`fixtures/record.py`); always present.
- `fixtures/gpu/*.json.gz`: three small real GPU traces copied unchanged from
  ../shared/traces (HolisticTraceAnalysis, MIT; `fixtures/gpu/sources.json` names each
  one's upstream path and checksum). Always present, so the GPU side is tested everywhere.
- `../shared/traces/`: real GPU traces copied from public projects (see its INDEX.md for
  each file's source and license). The folder may be absent on a fresh machine, so every
  test that needs it skips cleanly instead of failing. `TRACEQ_SHARED_TRACES` points
  elsewhere. A test that asks for a shared trace that is also bundled gets the bundled
  copy (the same bytes), so it runs without the folder.

`kineto_case` is parametrized over every Kineto trace of the three sets at session scope, so
pytest groups the tests that use it by trace: each trace is decoded once by traceq and
once by the stdlib `json` (the independent reference), and released before the next.
"""

from __future__ import annotations

import atexit
import copy
import gzip
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import settings

import traceq

# The suite never touches the user's real cache: off by default (the cache tests turn it on
# in folders of their own), and pointed at a private folder for what runs in subprocesses.
os.environ["TRACEQ_CACHE"] = "0"
os.environ["TRACEQ_CACHE_DIR"] = tempfile.mkdtemp(prefix="traceq-test-cache-")
atexit.register(shutil.rmtree, os.environ["TRACEQ_CACHE_DIR"], ignore_errors=True)

# Loading even a tiny trace costs tens of ms, so property tests run 100 examples by
# default; `HYPOTHESIS_PROFILE=thorough pytest ...` runs 3000 to hunt for rare failures.
settings.register_profile("default", max_examples=100, deadline=None)
settings.register_profile("thorough", max_examples=3000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_TRACES = Path(
    os.environ.get("TRACEQ_SHARED_TRACES", REPO_ROOT.parent / "shared" / "traces")
).resolve()
FIXTURES = REPO_ROOT / "fixtures"
GPU_FIXTURES = FIXTURES / "gpu"
CORPUS = FIXTURES / "corpus"  # Kineto + ET pairs (fixtures/record_corpus.py)
GPU_SOURCES = json.loads((GPU_FIXTURES / "sources.json").read_text())["traces"]
# shared relative path -> the bundled copy of the same bytes
BUNDLED = {entry["shared"]: GPU_FIXTURES / name for name, entry in GPU_SOURCES.items()}
# Execution Traces (PyTorch's graph dump, not Kineto) and raw memory timelines: not traces.
NOT_KINETO = ("_et.json", ".raw.gz", "execution_details.json")  # ET, raw, engine metadata
# `cat` of GPU activities (kernels, copies, sets) in the raw JSON, as Kineto writes them.
RAW_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
# Traces bigger than this are marked `slow` (deselect them with -m "not slow").
SLOW_FILE_BYTES = 700_000  # compressed size; roughly 40k events


# Where the loader puts each event (its documented contract), restated here rather than
# imported so that a change to the loader cannot silently move the target: complete (ph X)
# events by lower-cased `cat`, the rest by `ph`, anything else in `other`.
X_FRAMES = {
    "cpu_op": "ops",
    "operator": "ops",
    "kernel": "kernels",
    "gpu_memcpy": "kernels",
    "memcpy": "kernels",
    "gpu_memset": "kernels",
    "memset": "kernels",
    "mtia_ccp_events": "kernels",
    "cuda_runtime": "runtime",
    "runtime": "runtime",
    "cuda_driver": "runtime",
    "mtia_runtime": "runtime",
    "user_annotation": "annotations",
    "gpu_user_annotation": "annotations",
    "python_function": "python",
    "cuda_sync": "syncs",
}
PHASE_FRAMES = {
    "s": "flow_points",
    "t": "flow_points",
    "f": "flow_points",
    "i": "instants",
    "I": "instants",
    "C": "counters",
    "M": "threads",
}
# The frames that split the events between them: each event is in exactly one.
PARTITION = tuple(dict.fromkeys([*X_FRAMES.values(), *PHASE_FRAMES.values(), "other"]))


def frame_of(event: Any) -> str:
    """The frame an entry of `traceEvents` belongs in, read from its own `ph` and `cat`."""
    if not isinstance(event, dict):
        return "other"
    ph = event.get("ph")
    if ph == "X":
        return X_FRAMES.get(str(event.get("cat") or "").lower(), "other")
    return PHASE_FRAMES.get(ph, "other") if isinstance(ph, str) else "other"


def partition(raw_events: list[Any]) -> dict[str, list[int]]:
    """frame -> the indexes (= traceq's event ids) of the raw events that belong in it."""
    expected: dict[str, list[int]] = {name: [] for name in PARTITION}
    for index, event in enumerate(raw_events):
        expected[frame_of(event)].append(index)
    return expected


def assert_partition(trace: traceq.Trace, raw_events: list[Any]) -> None:
    """Each frame of the partition holds exactly the events `frame_of` puts there, so none
    is lost and none is counted twice."""
    expected = partition(raw_events)
    got = {name: sorted(trace.frames[name]["event"].to_list()) for name in PARTITION}
    assert got == expected


def shared_trace_paths() -> list[Path]:
    """Every file under ../shared/traces that looks like a trace (Kineto or not)."""
    if not SHARED_TRACES.is_dir():
        return []
    return sorted(p for p in SHARED_TRACES.rglob("*.json*") if p.is_file())


def is_kineto(path: Path) -> bool:
    return not any(marker in path.name for marker in NOT_KINETO)


def fixture_trace_paths() -> list[Path]:
    return sorted(FIXTURES.glob("*.pt.trace.json*"))


def gpu_fixture_paths() -> list[Path]:
    """The bundled real GPU traces (`fixtures/gpu/`), always present."""
    return sorted(GPU_FIXTURES / name for name in GPU_SOURCES)


def gpu_fixture(name: str) -> Path:
    """`gpu_fixture("hta-alexnet-a100")` -> fixtures/gpu/hta-alexnet-a100.json.gz."""
    return GPU_FIXTURES / f"{name}.json.gz"


def shared_or_bundled(relpath: str) -> Path:
    """The bundled copy of a shared trace where there is one, else the shared file."""
    return BUNDLED.get(relpath, SHARED_TRACES / relpath)


def _is_bundled_copy(path: Path) -> bool:
    """A shared file with the bytes of a bundled trace (tested once, as the bundled one)."""
    size = path.stat().st_size
    if not any(entry["bytes"] == size for entry in GPU_SOURCES.values()):
        return False
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return any(entry["sha256"] == digest for entry in GPU_SOURCES.values())


def read_json(path: Path, **kwargs: Any) -> Any:
    """The whole document, decoded by the stdlib: the reference traceq is checked against."""
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        return json.load(f, **kwargs)


def dumps_exact(document: Any) -> str:
    """JSON text of `document` with every `Decimal` (from `read_json(parse_float=Decimal)`)
    written as the exact number it holds, so an edited copy of a trace keeps its times."""
    exact: list[str] = []
    mark = "\x00decimal\x00"  # a string no trace holds: json writes it as \\u0000...

    def hold(value: Any) -> str:
        if not isinstance(value, Decimal):
            raise TypeError(f"not JSON: {type(value).__name__}")
        exact.append(format(value, "f"))
        return f"{mark}{len(exact) - 1}{mark}"

    text = json.dumps(document, default=hold)
    quoted = json.dumps(mark)[1:-1]
    pattern = re.compile(f'"{re.escape(quoted)}(\\d+){re.escape(quoted)}"')
    return pattern.sub(lambda m: exact[int(m.group(1))], text)


def write_json(document: Any, path: Path) -> Path:
    """Write `document` with `dumps_exact`."""
    path.write_text(dumps_exact(document))
    return path


def exact_ns(value: Any) -> int:
    """A trace time in microseconds (number or decimal text) as exact integer ns."""
    return int(Decimal(str(value)) * 1000)


class Raw:
    """A trace as the stdlib reads it (the independent reference): events by index (=
    traceq's event id), times in exact integer ns, launches found by correlation."""

    def __init__(self, source: Path | dict[str, Any]) -> None:
        """`source`: a trace file (decoded with every fraction kept exact as a `Decimal`), or
        a document already decoded, e.g. an edited copy."""
        if not isinstance(source, dict):
            source = read_json(source, parse_float=Decimal)
        self.document = source
        self.events: list[Any] = self.document["traceEvents"]

    def start(self, i: int) -> int:
        return exact_ns(self.events[i]["ts"])

    def dur(self, i: int) -> int:
        return exact_ns(self.events[i].get("dur", 0))

    def end(self, i: int) -> int:
        return self.start(i) + self.dur(i)

    def where(self, test: Callable[[dict[str, Any]], bool]) -> list[int]:
        """The complete (`ph` X) events that pass `test`, by index."""
        return [
            i
            for i, e in enumerate(self.events)
            if isinstance(e, dict) and e.get("ph") == "X" and test(e)
        ]

    def gpu(self) -> list[int]:
        """Kernels, copies and sets on the GPU."""
        return self.where(lambda e: e.get("cat") in RAW_GPU_CATS)

    @cached_property
    def runtime_by_corr(self) -> dict[int, int]:
        """correlation -> the first `cuda_runtime` call with it."""
        found: dict[int, int] = {}
        for i in self.where(lambda e: e.get("cat") == "cuda_runtime"):
            corr = (self.events[i].get("args") or {}).get("correlation")
            if corr is not None:
                found.setdefault(corr, i)
        return found

    def launch_of(self, i: int) -> int | None:
        """The runtime call that launched GPU activity `i`, by correlation."""
        return self.runtime_by_corr.get((self.events[i].get("args") or {}).get("correlation"))


@dataclass
class TraceCase:
    """One trace file: traceq's view of it and the stdlib's, each computed on first use."""

    path: Path
    label: str

    @cached_property
    def trace(self) -> traceq.Trace:
        """The trace as its file holds it: no capture trace's ops copied in (graph replays
        are tested on their own, `tests/test_graph_replay*.py`), so every row is an event
        of the raw JSON the tests compare with."""
        return traceq.load(self.path, capture=False)

    @cached_property
    def raw(self) -> Raw:
        return Raw(self.path)

    @property
    def document(self) -> dict[str, Any]:
        return self.raw.document

    @property
    def raw_events(self) -> list[Any]:
        return self.raw.events


def corpus_paths(name: str) -> tuple[Path, Path]:
    """A corpus entry's Kineto trace and ET; the test skips when it is not recorded."""
    kineto, et = CORPUS / f"{name}.pt.trace.json.gz", CORPUS / f"{name}.et.json.gz"
    if not (kineto.is_file() and et.is_file()):
        pytest.skip(f"corpus entry {name} is not recorded")
    return kineto, et


@cache
def corpus_trace(name: str) -> traceq.Trace:
    """A corpus entry's Kineto trace, loaded once for the whole run (the corpus tests only
    read it; a test that sets its data flow loads its own). Its data flow is inferred: the
    ET beside it is what the corpus tests measure inference against."""
    return traceq.load(corpus_paths(name)[0], execution_trace=False)


@cache
def corpus_et(name: str) -> pl.DataFrame:
    """A corpus entry's Execution Trace, loaded once for the whole run."""
    from traceq.relations.dataflow.execution_trace import load_execution_trace

    return load_execution_trace(corpus_paths(name)[1])


def split_copies(document: dict[str, Any], name: str, pieces: int) -> dict[str, Any]:
    """The same trace with each `name` copy issued as `pieces` back-to-back copies of equal
    size, each from its own runtime call inside the original call's time: the bytes, the
    copy engine's busy time and every op's span are unchanged (TQ203's many-small-copies
    case made from a real trace)."""
    doc = copy.deepcopy(document)
    events = doc["traceEvents"]
    runtime = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    next_corr = max(runtime) + 1
    replaced: dict[int, list[dict[str, Any]]] = {}
    out = []
    for event in events:
        if event.get("name") != name:
            out.append(event)
            continue
        call = runtime[event["args"]["correlation"]]
        for i in range(pieces):
            piece, part = copy.deepcopy(event), copy.deepcopy(call)
            for ev, whole in ((piece, event), (part, call)):
                ts, dur = exact_ns(whole["ts"]), exact_ns(whole["dur"])
                begin, until = ts + i * dur // pieces, ts + (i + 1) * dur // pieces
                ev["ts"], ev["dur"] = Decimal(begin) / 1000, Decimal(until - begin) / 1000
                ev["args"]["correlation"] = next_corr
            piece["args"]["bytes"] = event["args"]["bytes"] // pieces
            out.append(piece)
            replaced.setdefault(id(call), []).append(part)
            next_corr += 1
    doc["traceEvents"] = [p for e in out for p in replaced.get(id(e), [e])]
    return doc


def _label(path: Path) -> str:
    if path.is_relative_to(SHARED_TRACES):
        return str(path.relative_to(SHARED_TRACES))
    return str(path.relative_to(REPO_ROOT))


def _kineto_params() -> list[Any]:
    params = []
    shared = [p for p in shared_trace_paths() if is_kineto(p) and not _is_bundled_copy(p)]
    for path in [*fixture_trace_paths(), *gpu_fixture_paths(), *shared]:
        marks = [pytest.mark.shared] if path.is_relative_to(SHARED_TRACES) else []
        if path.stat().st_size > SLOW_FILE_BYTES:
            marks.append(pytest.mark.slow)
        params.append(pytest.param(path, id=_label(path), marks=marks))
    if not SHARED_TRACES.is_dir():
        params.append(
            pytest.param(
                None,
                id="shared-traces-absent",
                marks=pytest.mark.skip(reason=f"{SHARED_TRACES} is absent"),
            )
        )
    return params


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The columnar cache on (the suite runs with it off), in a folder of this test's own."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("TRACEQ_CACHE_DIR", str(folder))
    monkeypatch.setenv("TRACEQ_CACHE", "1")
    monkeypatch.delenv("TRACEQ_CACHE_MAX_BYTES", raising=False)
    return folder


def cache_entries(folder: Path) -> list[Path]:
    """The cached traces in a cache folder."""
    from traceq.loader.cache import SUFFIX

    return sorted(folder.glob(f"*{SUFFIX}")) if folder.is_dir() else []


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    """A small training trace copied into this test's folder: its cache entry is its own."""
    path = tmp_path / "trace.json.gz"
    shutil.copyfile(FIXTURES / "mlp_gelu-train.pt.trace.json.gz", path)
    return path


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Appends one item per JSON parse the loader does: a cache hit parses nothing."""
    from traceq.loader import load as load_module

    calls: list[int] = []
    real = load_module.decode_stream

    def counting(*args):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(load_module, "decode_stream", counting)
    return calls


def assert_same_trace(a: traceq.Trace, b: traceq.Trace) -> None:
    """The same metadata, events and frames, to the bit: what a cache hit must give."""
    from polars.testing import assert_frame_equal

    assert a.metadata == b.metadata
    assert_frame_equal(a.events, b.events)
    assert a.frames.keys() == b.frames.keys()
    for name in a.frames:
        assert_frame_equal(a.frames[name], b.frames[name], check_exact=True)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The real-trace folder, or skip the test when this machine has none."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"{SHARED_TRACES} is absent")
    return SHARED_TRACES


@pytest.fixture(scope="session")
def shared_trace() -> Callable[[str], Path]:
    """`shared_trace("hta/tests/data/...")` -> the path, or skip when it is absent."""

    def find(relpath: str) -> Path:
        path = shared_or_bundled(relpath)
        if not path.is_file():
            pytest.skip(f"{path} is absent")
        return path

    return find


@pytest.fixture(name="read_json", scope="session")
def read_json_fixture() -> Callable[..., Any]:
    """The stdlib reader (`read_json(path, parse_float=Decimal)`): the independent reference."""
    return read_json


@pytest.fixture(scope="session")
def fixture_traces() -> list[Path]:
    """The project's own recorded traces (`fixtures/*.pt.trace.json.gz`)."""
    paths = fixture_trace_paths()
    if not paths:
        pytest.skip("no fixture traces recorded in fixtures/")
    return paths


@pytest.fixture(scope="session")
def load_shared() -> Callable[[str], traceq.Trace]:
    """Load a shared trace by relative path (skip when absent), each at most once."""
    cache: dict[str, traceq.Trace] = {}

    def load(relpath: str) -> traceq.Trace:
        if relpath not in cache:
            path = shared_or_bundled(relpath)
            if not path.is_file():
                pytest.skip(f"{path} is absent")
            cache[relpath] = traceq.load(path)
        return cache[relpath]

    return load


@pytest.fixture(scope="session", params=_kineto_params())
def kineto_case(request: pytest.FixtureRequest) -> TraceCase:
    """Each Kineto trace (fixtures, bundled GPU traces and shared), with traceq's and the
    stdlib's view of it."""
    path: Path = request.param
    return TraceCase(path=path, label=_label(path))


def edges_into(trace: traceq.Trace, et: pl.DataFrame, consumers: pl.Series) -> tuple[set, set]:
    """(inferred, exact) (producer, consumer) pairs into `consumers` (trace events), the
    exact ones from the ET's tensor ids."""
    from traceq.relations.dataflow.execution_trace import tensor_edges

    key = ["producer", "consumer"]
    into = pl.col("consumer").is_in(consumers.implode())
    inferred = set(trace.dataflow.filter(into).select(key).iter_rows())
    exact = set(tensor_edges(trace, et).filter(into).select(key).iter_rows())
    return inferred, exact
