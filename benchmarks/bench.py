"""Compare traceq with Holistic Trace Analysis (HTA): load time, peak memory, critical path.

One run builds the big trace if it is missing (``make_big_trace.py`` replicates the
``df_index_resolver`` trace from HTA's own test data N times), then measures every
(tool, task) pair in a fresh subprocess, so that each peak RSS belongs to one tool alone
and no tool profits from another's warm imports or allocator. Results go to stdout as a
Markdown table and, with ``--json``, to a file together with the machine's facts.

    python benchmarks/bench.py                  # full run, 10 copies (~2.2M events)
    python benchmarks/bench.py --quick          # smoke run, 2 copies, one repeat
    python benchmarks/bench.py --skip-hta --json out.json

HTA runs in its own interpreter (``--hta-python``, default ``$HTA_PYTHON`` or
``../venv-hta/bin/python`` next to the repository), because it pins pandas and pulls in
Jupyter. This file imports only the standard library at module level so that the same file
serves as the child script in both interpreters.
"""

import argparse
import contextlib
import gzip
import importlib
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_SOURCE = (
    REPO.parent / "shared/traces/hta/tests/data/df_index_resolver/df_index_resolver.json.gz"
)
DEFAULT_CACHE = HERE / ".cache"
TRACEQ_CACHE = DEFAULT_CACHE / "traceq-cache"  # traceq's columnar cache, for the cached rows
HTA_INSTALL_HINT = (
    "python3 -m venv venv-hta && venv-hta/bin/pip install holistictraceanalysis 'pandas<3'"
)
MIB = 1024 * 1024


# ---------------------------------------------------------------------------------------
# Child side: one task per process. Each task imports what it needs, times only the work
# (imports are timed separately), and returns facts that show the work really happened.
# ---------------------------------------------------------------------------------------


class Unavailable(Exception):
    """The tool or the API this task needs is not there (yet); the row says so."""


def _proc_status_mb(key: str) -> float:
    """Read a memory line (VmRSS, VmHWM) of this process from /proc, in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _open_trace(path: str) -> Any:
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _read_trace_bytes(path: str) -> bytes:
    with _open_trace(path) as f:
        return f.read()


class Timing(NamedTuple):
    """Wall time, and CPU time of all the process's threads: the latter shrugs off a busy box."""

    seconds: float
    cpu_seconds: float

    def fields(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}seconds": self.seconds, f"{prefix}cpu_seconds": self.cpu_seconds}


def _timed(fn: Callable[[], Any]) -> tuple[Timing, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return Timing(time.perf_counter() - wall, time.process_time() - cpu), value


def task_read(path: str) -> dict[str, Any]:
    """Read the file's bytes and, for .gz, decompress them: the floor for any loader."""
    timing, data = _timed(lambda: _read_trace_bytes(path))
    return {**timing.fields(), "bytes": len(data)}


def task_json(path: str) -> dict[str, Any]:
    """The stdlib ``json`` parse into dicts, as HTA's default JSON backend does first."""

    def parse() -> Any:
        with _open_trace(path) as f:
            return json.load(f)

    timing, trace = _timed(parse)
    return {**timing.fields(), "events": len(trace["traceEvents"])}


def _msgspec_types(lazy_args: bool) -> Any:
    """Typed schema for a Kineto trace; defined on demand so HTA's interpreter never needs it."""
    import msgspec

    # msgspec accepts no ``Raw | None`` union, so the lazy variant defaults to a raw null.
    args_type: Any = msgspec.Raw if lazy_args else dict[str, Any] | None
    args_default: Any = msgspec.Raw(b"null") if lazy_args else None

    class Event(msgspec.Struct):
        ph: str
        name: str = ""
        cat: str = ""
        ts: int | float | None = None
        dur: int | float | None = None
        pid: int | str | None = None
        tid: int | str | None = None
        id: int | str | None = None
        args: args_type = args_default

    class Trace(msgspec.Struct):
        traceEvents: list[Event]

    return Trace


def _msgspec_task(path: str, lazy_args: bool) -> dict[str, Any]:
    import msgspec

    start = time.perf_counter()
    trace_type = _msgspec_types(lazy_args)
    decoder = msgspec.json.Decoder(trace_type)
    import_seconds = time.perf_counter() - start
    timing, trace = _timed(lambda: decoder.decode(_read_trace_bytes(path)))
    return {**timing.fields(), "import_seconds": import_seconds, "events": len(trace.traceEvents)}


def task_msgspec(path: str) -> dict[str, Any]:
    """msgspec decode into typed structs, ``args`` decoded to dicts: a full-decode baseline."""
    return _msgspec_task(path, lazy_args=False)


def task_msgspec_lazy(path: str) -> dict[str, Any]:
    """As ``task_msgspec`` but ``args`` kept as raw JSON bytes: a lazy-decode baseline."""
    return _msgspec_task(path, lazy_args=True)


DUCKDB_COLUMNS = (
    "{'ph': 'VARCHAR', 'cat': 'VARCHAR', 'name': 'VARCHAR', 'pid': 'VARCHAR', "
    "'tid': 'VARCHAR', 'ts': 'DOUBLE', 'dur': 'DOUBLE', 'id': 'VARCHAR', 'args': 'JSON'}"
)


def task_duckdb(path: str) -> dict[str, Any]:
    """DuckDB's parallel JSON reader on the bare `traceEvents` array (cut out beforehand, not
    timed): nine columns into Arrow, `args` as JSON. What a native columnar parser costs."""
    try:
        import duckdb
    except ImportError as exc:
        raise Unavailable("duckdb is not installed") from exc
    con = duckdb.connect()
    con.execute(f"SET threads = {os.cpu_count() or 1}")
    quoted = path.replace("'", "''")
    query = f"SELECT * FROM read_json('{quoted}', format = 'array', columns = {DUCKDB_COLUMNS})"
    timing, _ = _timed(lambda: con.execute(f"CREATE TABLE events AS {query}"))
    return {**timing.fields(), "events": con.execute("SELECT count(*) FROM events").fetchone()[0]}


def _import_traceq(*needed: str) -> tuple[Any, float]:
    start = time.perf_counter()
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    try:
        import traceq
    except Exception as exc:  # any import failure means "not ready", not a crash
        raise Unavailable(f"import traceq failed: {type(exc).__name__}: {exc}") from exc
    missing = [name for name in needed if not hasattr(traceq, name)]
    if missing:
        raise Unavailable(f"traceq has no {', '.join(missing)} yet")
    return traceq, time.perf_counter() - start


def _materialize(value: Any) -> Any:
    """Collect lazy results so that the timing covers the work, not the query plan."""
    if hasattr(value, "collect"):
        return value.collect()
    return value


def _frame_heights(trace: Any) -> dict[str, int]:
    heights: dict[str, int] = {}
    for name in ("events", "kernels", "cpu_ops", "runtime", "flows"):
        with contextlib.suppress(Exception):
            frame = getattr(trace, name)
            heights[name] = int(frame.height if hasattr(frame, "height") else len(frame))
    return heights


def task_traceq_load(path: str) -> dict[str, Any]:
    """``traceq.load(path)`` with the cache off: bytes to Polars frames, a cold load."""
    traceq, import_seconds = _import_traceq("load")
    timing, trace = _timed(lambda: traceq.load(path, cache=False))
    return {**timing.fields(), "import_seconds": import_seconds, **_frame_heights(trace)}


def task_traceq_load_cached(path: str) -> dict[str, Any]:
    """``traceq.load(path)`` on a warm cache (a separate untimed process fills it), then every
    frame decoded: `seconds` holds both, like HTA's load, which builds everything; a hit
    decodes columns on first use, so `load_call_seconds` (the call alone) is apart."""
    traceq, import_seconds = _import_traceq("load")
    fill = "import sys, traceq; traceq.load(sys.argv[1])"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", fill, path], check=True, capture_output=True, env=env)
    call, trace = _timed(lambda: traceq.load(path))

    def decode_all() -> int:
        return trace.events.height + sum(trace.frames[name].height for name in trace.frames)

    rest, _ = _timed(decode_all)
    total = Timing(call.seconds + rest.seconds, call.cpu_seconds + rest.cpu_seconds)
    return {
        **total.fields(),
        **call.fields("load_call_"),
        "import_seconds": import_seconds,
        **_frame_heights(trace),
    }


def task_traceq_info_cached(path: str) -> dict[str, Any]:
    """The whole ``traceq info PATH`` process on a warm cache (one untimed run fills it):
    interpreter start, imports, the cached load and the summary."""
    command = [sys.executable, "-c", "from traceq.cli.main import main; main()", "info", path]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(command, check=True, capture_output=True, env=env)  # fills the cache
    wall = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - wall
    if os.waitstatus_to_exitcode(status) != 0:
        raise Unavailable(f"traceq info exited {os.waitstatus_to_exitcode(status)}")
    return {
        "seconds": seconds,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "process_peak_mb": usage.ru_maxrss / 1024,
    }


def task_traceq_cp(path: str, region: Any = None) -> dict[str, Any]:
    """``trace.critical_path()`` over the whole trace, after a (separately timed) load."""
    traceq, import_seconds = _import_traceq("load")
    start = time.perf_counter()
    importlib.import_module(
        "traceq.relations.critical_path"
    )  # networkx, scipy: imports, timed apart
    import_seconds += time.perf_counter() - start
    load, trace = _timed(lambda: traceq.load(path))
    if not hasattr(trace, "critical_path"):
        raise Unavailable("traceq Trace has no critical_path() yet")
    timing, path_value = _timed(lambda: _materialize(trace.critical_path(region)))
    out: dict[str, Any] = {
        **timing.fields(),
        **load.fields("load_"),
        "import_seconds": import_seconds,
    }
    with contextlib.suppress(Exception):
        out["path_length"] = len(path_value)
    return out


def task_traceq_cp_step(path: str) -> dict[str, Any]:
    """``trace.critical_path(("ProfilerStep", 1))``: the same step as HTA's ``instance_id=1``."""
    return task_traceq_cp(path, ("ProfilerStep", 1))


def task_traceq_analyze(path: str) -> dict[str, Any]:
    """``traceq.analyze(trace)``: every built-in rule, after a (separately timed) load."""
    traceq, import_seconds = _import_traceq("load", "analyze")
    load, trace = _timed(lambda: traceq.load(path))
    timing, findings = _timed(lambda: _materialize(traceq.analyze(trace)))
    out: dict[str, Any] = {
        **timing.fields(),
        **load.fields("load_"),
        "import_seconds": import_seconds,
    }
    with contextlib.suppress(Exception):
        out["findings"] = len(findings)
    return out


def _hta_load(trace_dir: str) -> tuple[Any, float, Timing]:
    start = time.perf_counter()
    try:
        from hta.trace_analysis import TraceAnalysis
    except Exception as exc:
        raise Unavailable(f"import hta failed ({exc}); install with: {HTA_INSTALL_HINT}") from exc
    import_seconds = time.perf_counter() - start
    load, analyzer = _timed(lambda: TraceAnalysis(trace_dir=trace_dir))
    return analyzer, import_seconds, load


def task_hta_load(trace_dir: str) -> dict[str, Any]:
    """``TraceAnalysis(trace_dir=...)``: parse, build the pandas frame, align, filter."""
    analyzer, import_seconds, load = _hta_load(trace_dir)
    rank = analyzer.t.get_ranks()[0]
    return {
        **load.fields(),
        "import_seconds": import_seconds,
        "rank": int(rank),
        "rows": len(analyzer.t.get_trace(rank)),
    }


def _hta_cp(trace_dir: str, annotation: str, instance_id: Any) -> dict[str, Any]:
    analyzer, import_seconds, load = _hta_load(trace_dir)
    rank = analyzer.t.get_ranks()[0]
    timing, result = _timed(
        lambda: analyzer.critical_path_analysis(
            rank=rank, annotation=annotation, instance_id=instance_id
        )
    )
    if result is None:
        raise Unavailable(f"HTA found no annotation {annotation!r}")
    graph, success = result
    return {
        **timing.fields(),
        **load.fields("load_"),
        "import_seconds": import_seconds,
        "success": bool(success),
        "graph_nodes": graph.number_of_nodes(),
        "graph_edges": graph.number_of_edges(),
        "critical_path_nodes": len(graph.critical_path_nodes),
    }


def task_hta_cp(trace_dir: str) -> dict[str, Any]:
    """HTA critical path over the whole trace: ``annotation=""``, ``instance_id=None``."""
    return _hta_cp(trace_dir, annotation="", instance_id=None)


def task_hta_cp_step(trace_dir: str) -> dict[str, Any]:
    """HTA critical path of one step: ``annotation="ProfilerStep"``, ``instance_id=1``."""
    return _hta_cp(trace_dir, annotation="ProfilerStep", instance_id=1)


def task_versions(_: str) -> dict[str, Any]:
    """Versions of the packages this interpreter would use, for the machine facts."""
    from importlib import metadata

    versions: dict[str, Any] = {"python": platform.python_version()}
    for dist in ("traceq", "polars", "msgspec", "HolisticTraceAnalysis", "pandas", "numpy"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    return {"seconds": 0.0, "versions": versions}


TASKS: dict[str, Callable[[str], dict[str, Any]]] = {
    "read": task_read,
    "json": task_json,
    "msgspec": task_msgspec,
    "msgspec-lazy": task_msgspec_lazy,
    "duckdb": task_duckdb,
    "traceq-load": task_traceq_load,
    "traceq-load-cached": task_traceq_load_cached,
    "traceq-info-cached": task_traceq_info_cached,
    "traceq-cp": task_traceq_cp,
    "traceq-cp-step": task_traceq_cp_step,
    "traceq-analyze": task_traceq_analyze,
    "hta-load": task_hta_load,
    "hta-cp": task_hta_cp,
    "hta-cp-step": task_hta_cp_step,
    "versions": task_versions,
}


def child_main(task: str, path: str, out: str) -> None:
    rss_start = _proc_status_mb("VmRSS")
    try:
        result = TASKS[task](path)
        result["status"] = "ok"
    except Unavailable as exc:
        result = {"status": "unavailable", "reason": str(exc)}
    result["rss_start_mb"] = rss_start
    result["vm_hwm_mb"] = _proc_status_mb("VmHWM")
    Path(out).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------
# Parent side: prepare inputs, run each measurement in fresh processes, summarize.
# ---------------------------------------------------------------------------------------


@dataclass
class Measurement:
    """One row of the table: a tool doing a task on a trace, repeated in fresh processes."""

    tool: str
    task: str
    trace: str
    child_task: str
    path: Path
    python: str
    repeats: int
    group: str
    json_bytes: int | None = None  # size of the JSON the row parses, for MB/s
    runs: list[dict[str, Any]] = field(default_factory=list)

    def ok_runs(self) -> list[dict[str, Any]]:
        return [r for r in self.runs if r.get("status") == "ok"]

    def seconds(self, key: str = "seconds") -> float | None:
        ok = self.ok_runs()
        return statistics.median(r[key] for r in ok) if ok else None

    def peak_mb(self) -> float | None:
        ok = self.ok_runs()
        return max(max(r["peak_mb"], r.get("process_peak_mb", 0.0)) for r in ok) if ok else None

    def status(self) -> str:
        if self.ok_runs():
            return "ok"
        if not self.runs:
            return "skipped"
        return self.runs[-1].get("reason") or self.runs[-1].get("status", "failed")


def run_child(python: str, task: str, path: Path) -> dict[str, Any]:
    """Run one task in a fresh interpreter; peak RSS comes from the kernel via wait4."""
    with tempfile.TemporaryDirectory(prefix="traceq-bench-") as tmp:
        out = Path(tmp) / "result.json"
        log = Path(tmp) / "child.log"
        cmd = [python, str(Path(__file__).resolve()), "--child", task, str(path), str(out)]
        loadavg = os.getloadavg()[0]
        start = time.perf_counter()
        env = {**os.environ, "TRACEQ_CACHE_DIR": str(TRACEQ_CACHE)}  # never the user's cache
        with open(log, "wb") as log_file:
            proc = subprocess.Popen(
                cmd, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO, env=env
            )
            _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        if proc.returncode != 0 or not out.exists():
            tail = log.read_text(errors="replace").strip().splitlines()[-20:] or [""]
            return {
                "status": "failed",
                "reason": f"exit {proc.returncode}: {tail[-1][:120]}",
                "log_tail": tail,
                "wall_seconds": wall,
                "loadavg_1m": loadavg,
            }
        result = json.loads(out.read_text())
    result["wall_seconds"] = wall
    result["loadavg_1m"] = loadavg
    # ru_maxrss is in KiB on Linux and covers the child and any processes it waited for.
    result["peak_mb"] = max(usage.ru_maxrss / 1024, result.get("vm_hwm_mb", 0.0))
    return result


def ensure_big_trace(source: Path, copies: int, cache: Path) -> tuple[Path, Path]:
    """Build (once) the replicated trace as plain JSON and a gzipped copy of the same bytes."""
    cache.mkdir(parents=True, exist_ok=True)
    plain = cache / f"big{copies}.json"
    if not plain.exists():
        print(f"building {plain} ({copies} copies of {source.name}) ...", file=sys.stderr)
        tmp = plain.with_suffix(".json.tmp")
        subprocess.run(
            [
                sys.executable,
                str(HERE / "make_big_trace.py"),
                str(source),
                str(tmp),
                "--copies",
                str(copies),
            ],
            check=True,
        )
        # make_big_trace picks plain vs gzip output by suffix; ".tmp" means plain.
        tmp.rename(plain)
    gz = cache / f"big{copies}.json.gz"
    if not gz.exists() or gz.stat().st_mtime < plain.stat().st_mtime:
        print(f"compressing {gz} ...", file=sys.stderr)
        tmp_gz = cache / f"big{copies}.json.gz.tmp"
        with open(plain, "rb") as src, gzip.open(tmp_gz, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 16 * MIB)
        tmp_gz.rename(gz)
    return plain, gz


def events_array_for(trace: Path, cache: Path) -> Path:
    """The trace's bare `traceEvents` array as a file: the only shape DuckDB reads fast (the
    whole trace object, read as one value, took 30 s here). Built once, only for DuckDB."""
    array = cache / (trace.name.split(".")[0] + ".events.json")
    if importlib.util.find_spec("duckdb") and not array.exists():
        import msgspec

        class Top(msgspec.Struct):
            traceEvents: msgspec.Raw

        array.write_bytes(msgspec.json.decode(_read_trace_bytes(str(trace)), type=Top).traceEvents)
    return array


def hta_dir_for(trace: Path, cache: Path) -> Path:
    """HTA takes a directory and loads every .json/.gz in it: give it one holding only ours."""
    if [p.name for p in trace.parent.iterdir() if p.suffix in (".json", ".gz")] == [trace.name]:
        return trace.parent
    folder = cache / "hta-dirs" / trace.name.replace(".", "_")
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / trace.name
    if not link.exists():
        link.symlink_to(trace.resolve())
    return folder


def warm_page_cache(*paths: Path) -> None:
    """Read each file once so that the first measured tool does not pay for the disk."""
    for path in paths:
        with open(path, "rb") as f:
            while f.read(16 * MIB):
                pass


def find_hta_python(explicit: str | None) -> str | None:
    candidates = [explicit, os.environ.get("HTA_PYTHON"), str(REPO.parent / "venv-hta/bin/python")]
    candidates.append(sys.executable)
    for candidate in candidates:
        if not candidate or not Path(candidate).exists():
            continue
        probe = subprocess.run(
            [candidate, "-c", "import hta.trace_analysis"], capture_output=True, check=False
        )
        if probe.returncode == 0:
            return candidate
        if candidate == explicit:
            sys.exit(f"--hta-python {explicit} cannot import hta.trace_analysis")
    return None


def machine_facts(hta_python: str | None) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                facts["cpu_model"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                facts["mem_total_gb"] = round(int(line.split()[1]) / 1024 / 1024, 1)
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        git = ["git", "-C", str(REPO)]
        facts["git_commit"] = subprocess.run(
            [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        facts["git_dirty"] = bool(
            subprocess.run(
                [*git, "status", "--porcelain", "traceq"], capture_output=True, text=True
            ).stdout.strip()
        )
    facts["loadavg_at_start"] = os.getloadavg()
    facts["main_versions"] = run_child(sys.executable, "versions", REPO).get("versions")
    if hta_python:
        facts["hta_python"] = hta_python
        facts["hta_versions"] = run_child(hta_python, "versions", REPO).get("versions")
    return facts


def plan(
    args: argparse.Namespace, big: Path, big_gz: Path, hta_python: str | None
) -> list[Measurement]:
    """The rows to measure, cheap baselines first; each group shares one HTA reference row."""
    small = args.source
    big_load = big_gz if args.gz else big
    big_array = events_array_for(big, args.cache_dir)

    def row(
        tool: str,
        task: str,
        child_task: str,
        trace: Path,
        group: str,
        *,
        hta: bool = False,
        repeats: int = args.repeats,
    ) -> Measurement:
        python = hta_python if hta and hta_python else sys.executable
        path = hta_dir_for(trace, args.cache_dir) if hta else trace
        return Measurement(
            tool, task, trace.name, child_task, path, python, repeats, group, json_size(trace)
        )

    rows = [
        row("stdlib", "read bytes", "read", big, "io"),
        row("stdlib", "gunzip", "read", big_gz, "io"),
        row("stdlib", "json.load", "json", big_load, "load"),
        row("msgspec", "typed decode", "msgspec", big_load, "load"),
        row("msgspec", "typed decode, raw args", "msgspec-lazy", big_load, "load"),
        row("duckdb", "read_json, bare events array", "duckdb", big_array, "load"),
        row("traceq", "load, cold (cache off)", "traceq-load", big, "load"),
        row("traceq", "load, cold (cache off)", "traceq-load", big_gz, "load"),
        row("traceq", "load, cached (every frame decoded)", "traceq-load-cached", big, "load"),
        row("traceq", "`traceq info`, cached (whole process)", "traceq-info-cached", big, "load"),
        row("traceq", "load, cold (cache off)", "traceq-load", small, "load-small"),
        row(
            "traceq",
            "`traceq info`, cached (whole process)",
            "traceq-info-cached",
            small,
            "load-small",
        ),
        row("traceq", "critical path (whole trace)", "traceq-cp", small, "cp"),
        row("traceq", "critical path (1 step)", "traceq-cp-step", small, "cp-step"),
        row("traceq", "analyze", "traceq-analyze", small, "analyze-small"),
        row("traceq", "analyze", "traceq-analyze", big_load, "analyze"),
    ]
    if hta_python and not args.skip_hta:
        rows += [
            row("HTA", "load", "hta-load", small, "load-small", hta=True),
            row("HTA", "critical path (whole trace)", "hta-cp", small, "cp", hta=True),
            row("HTA", "critical path (1 step)", "hta-cp-step", small, "cp-step", hta=True),
            row("HTA", "load", "hta-load", big_load, "load", hta=True, repeats=args.hta_repeats),
        ]
    return rows


def json_size(path: Path) -> int | None:
    """Bytes of JSON in a trace file (gunzipped), or None for a folder."""
    if not path.is_file():
        return None
    if path.suffix != ".gz":
        return path.stat().st_size
    size = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(16 * MIB):
            size += len(chunk)
    return size


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def references(rows: list[Measurement]) -> dict[str, Measurement]:
    """Each group's HTA row, the reference of the ratios."""
    return {r.group: r for r in rows if r.tool == "HTA" and r.status() == "ok"}


def render_table(rows: list[Measurement]) -> str:
    """Markdown: medians of wall and CPU seconds, the largest peak RSS, ratios to HTA's row."""
    reference = references(rows)
    lines = [
        "| tool | task | trace | seconds | CPU s | peak MB | MB/s | × HTA speed | time ÷ HTA "
        "| CPU ÷ HTA | peak ÷ HTA | runs |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        seconds, cpu, peak = row.seconds(), row.seconds("cpu_seconds"), row.peak_mb()
        ref = reference.get(row.group)
        speedup = time_ratio = cpu_ratio = mem_ratio = "-"
        if ref is not None and row is not ref and seconds is not None and peak is not None:
            speedup = f"{ref.seconds() / seconds:.1f}"
            time_ratio = f"{seconds / ref.seconds():.3f}"
            cpu_ratio = f"{cpu / ref.seconds('cpu_seconds'):.3f}"
            mem_ratio = f"{peak / ref.peak_mb():.2f}"
        rate = "-"
        if row.status() != "ok":
            cells = f"n/a: {row.status()} | - | -"
        else:
            cells = f"{fmt(seconds)} | {fmt(cpu)} | {fmt(peak, 0)}"
            if row.json_bytes and seconds and row.group.startswith("load"):
                rate = f"{row.json_bytes / MIB / seconds:,.0f}"
        lines.append(
            f"| {row.tool} | {row.task} | {row.trace} | {cells} | {rate} | {speedup} "
            f"| {time_ratio} | {cpu_ratio} | {mem_ratio} | {len(row.ok_runs())} |"
        )
    paired = [
        f"{row.tool} {row.task}, {row.trace}: " + ", ".join(f"{x:.1f}" for x in speedups)
        for row in rows
        if (speedups := paired_speedups(row, reference))
    ]
    if paired:
        lines.append(
            "\n× HTA speed round by round (HTA's run over the row's run of the same round):\n"
            + "\n".join(f"- {line}" for line in paired)
        )
    loads = [r["loadavg_1m"] for row in rows for r in row.runs if "loadavg_1m" in r]
    if loads:
        lines.append(
            f"\n1-minute load average at the start of each run: median"
            f" {statistics.median(loads):.1f}, max {max(loads):.1f}, on {os.cpu_count()} CPUs"
            " (far above the CPU count means wall times are inflated; CPU s much less so)."
        )
    return "\n".join(lines)


def measure(rows: list[Measurement]) -> None:
    """Run the rows in rounds, each round every row once, so that a row and its HTA
    reference are measured minutes apart at most, not a whole table apart: this machine's
    speed drifts by up to a third over the day, and when traceq's rows ran first and HTA's
    last, the drift between them moved the ratio (6.6-8.0x for the same code in six runs)."""
    for i in range(max((row.repeats for row in rows), default=0)):
        for row in rows:
            if i >= row.repeats or (row.runs and row.runs[-1].get("status") != "ok"):
                continue  # an unavailable or failed tool will not improve on a retry
            result = run_child(row.python, row.child_task, row.path)
            result["round"] = i + 1
            row.runs.append(result)
            print(
                f"[{row.tool} | {row.task} | {row.trace}] run {i + 1}/{row.repeats}: "
                f"{result.get('status')} {fmt(result.get('seconds'))} s "
                f"({fmt(result.get('cpu_seconds'))} CPU s, load {result['loadavg_1m']:.1f}), "
                f"{fmt(result.get('peak_mb'), 0)} MB {result.get('reason', '')}",
                file=sys.stderr,
                flush=True,
            )


def paired_speedups(row: Measurement, references: dict[str, Measurement]) -> list[float] | None:
    """HTA's time over the row's, round by round (each pair ran minutes apart); None for a
    row without an HTA reference, or for the reference itself."""
    reference = references.get(row.group)
    if reference is None or row is reference:
        return None
    hta = {r["round"]: r["seconds"] for r in reference.ok_runs() if "round" in r}
    return [
        round(hta[r["round"]] / r["seconds"], 2)
        for r in row.ok_runs()
        if r.get("round") in hta and r["seconds"]
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=10, help="copies in the big trace")
    parser.add_argument("--quick", action="store_true", help="2 copies, 1 repeat: a smoke run")
    parser.add_argument("--skip-hta", action="store_true", help="measure traceq and baselines")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per row")
    parser.add_argument(
        "--hta-repeats", type=int, default=3, help="repeats of HTA's big load (its median)"
    )
    parser.add_argument("--gz", action="store_true", help="load the big trace from .json.gz")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="TEXT",
        help="run only rows whose tool/task/trace contains TEXT (repeatable)",
    )
    parser.add_argument(
        "--source",
        type=Path,
        default=DEFAULT_SOURCE,
        help="the trace to replicate and to run critical paths on",
    )
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--hta-python", help="interpreter with HTA installed")
    parser.add_argument(
        "--json",
        type=Path,
        help="write all runs and machine facts here (default for a full run: the committed "
        "latest result, benchmarks/results/bench.json; git keeps the earlier ones)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.copies, args.repeats, args.hta_repeats = 2, 1, 1
    elif args.json is None:
        args.json = Path(__file__).parent / "results" / "bench.json"
    if not args.source.exists():
        parser.error(f"--source {args.source} does not exist")
    return args


def main(argv: list[str] | None = None) -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child_main(*sys.argv[2:5])
        return
    args = parse_args(argv)
    big, big_gz = ensure_big_trace(args.source, args.copies, args.cache_dir)
    hta_python = None if args.skip_hta else find_hta_python(args.hta_python)
    if not args.skip_hta and hta_python is None:
        print(f"HTA not found; rows skipped. Install with: {HTA_INSTALL_HINT}", file=sys.stderr)
    facts = machine_facts(hta_python)
    rows = plan(args, big, big_gz, hta_python)
    if args.only:
        rows = [
            r
            for r in rows
            if any(t.lower() in f"{r.tool} {r.task} {r.trace}".lower() for t in args.only)
        ]
    warm_page_cache(big, big_gz, args.source)
    measure(rows)
    table = render_table(rows)
    print(table)
    reference = references(rows)
    if args.json:
        payload = {
            "machine": facts,
            "copies": args.copies,
            "big_trace": {
                "path": str(big),
                "bytes": big.stat().st_size,
                "gz_bytes": big_gz.stat().st_size,
            },
            "source": str(args.source),
            "rows": [
                {
                    "tool": r.tool,
                    "task": r.task,
                    "trace": r.trace,
                    "group": r.group,
                    "status": r.status(),
                    "seconds_median": r.seconds(),
                    "cpu_seconds_median": r.seconds("cpu_seconds"),
                    "peak_mb_max": r.peak_mb(),
                    "paired_speedups": paired_speedups(r, reference),
                    "json_bytes": r.json_bytes,
                    "runs": r.runs,
                }
                for r in rows
            ],
            "table_markdown": table,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
