"""Graph replays: which CPU op launched each kernel a CUDA/HIP graph replayed.

In a replay every kernel hangs off one `cudaGraphLaunch`/`hipGraphLaunch` (they share its
correlation): no op, no module, no shapes. The ops that launched them ran once, while the
graph was captured. A capture trace (profiled around `torch.cuda.graph` capture, as vLLM,
SGLang and xDiT write them to `capture_traces/`) records those ops: each launch call made
under `cudaStreamBeginCapture` .. `cudaStreamEndCapture` is a node of the graph and runs
on no GPU then. ROCm's launch calls name their kernel (`args.kernel`); CUDA's do not.

Each replayed kernel is paired with one captured launch, most exact method first:

- `graph-node-id` (1.0): the captured launch of the same `graph node id`, where newer
  Kineto records it on both sides;
- `capture-order` (0.95): the launch at its position, when the replay's sequence is the
  capture's (names equal; 0.8 where the launches do not name their kernels, as on CUDA);
  also a kernel alone between two matched ones, by position (0.6: a renamed kernel);
- `capture-name-scan` (0.85): per stream, the largest first, the launch its name lines up
  with in the longest runs of equal names between the stream's kernels and the launches
  not yet taken (`difflib.SequenceMatcher`: a dropped or extra kernel, another stream's
  kernels in between);
- `capture-queue` (0.5): the first launch of its name not yet taken;
- `launch` (0.2; 0 without an op): nothing captured pairs with it; its op and module are
  those around the graph launch in the replay: "replayed, ops unknown".

A graph launch is matched to one captured graph: the smallest captured batch size at
least the step's (`relations.inference`: tokens, else requests), then the graph whose
sequence of kernel names is the launch's (PIECEWISE pieces: the k-th launch of a step
takes the k-th piece of equal score). Each distinct pair (graph, replayed sequence) is
aligned once: a serving trace replays a few graphs thousands of times.

The op's event id refers to the capture trace (`capture_op_event`, `capture_source`), so
the kernel row carries what is needed of it: `op_name`, `op_shapes`, `module`.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from dataclasses import dataclass
from difflib import SequenceMatcher
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from traceq.relations.launches import GRAPH_LAUNCH, LAUNCH_API

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace

METHODS = ("graph-node-id", "capture-order", "capture-name-scan", "capture-queue", "launch")
CONFIDENCE = {
    "graph-node-id": 1.0,
    "capture-order": 0.95,
    "capture-order-unnamed": 0.8,
    "capture-order-gap": 0.6,
    "capture-name-scan": 0.85,
    "capture-queue": 0.5,
    "launch": 0.2,
}
CAPTURE_FOLDER = "capture_traces"
DETAILS_FILE = "execution_details.json"
CAPTURE_RANGE = r"^capture_(\d+)_([A-Za-z]+)"
"""vLLM's and SGLang's range around one capture: `capture_<batch size>_<mode>`."""

ATTRIBUTION = {
    "event": pl.UInt32,
    "replay_method": pl.String,
    "replay_confidence": pl.Float64,
    "capture_source": pl.String,
    "capture_graph": pl.Int64,
    "capture_op_event": pl.Int64,
    "capture_op_name": pl.String,
    "capture_op_shapes": pl.String,
    "capture_module": pl.String,
}


@dataclass(frozen=True)
class CaptureFile:
    """A capture trace to read, and what `execution_details.json` says it captured."""

    path: Path
    batch_size: int | None = None
    mode: str | None = None


@dataclass(frozen=True)
class Capture:
    """A loaded capture trace and what it captured."""

    trace: LoadedTrace
    source: str
    batch_size: int | None = None
    mode: str | None = None


# -- finding capture traces ------------------------------------------------------------------
def capture_files(capture: str | os.PathLike[str] | None, replay: Any) -> list[CaptureFile]:
    """The capture traces for a replay: `capture` (a trace, or a folder with
    `execution_details.json` or with traces), or, when None, the `capture_traces/` folder
    beside the replay file. Empty when there is none."""
    if capture is None:
        if not isinstance(replay, (str, os.PathLike)):
            return []
        folder = Path(replay).parent / CAPTURE_FOLDER
        return _folder_files(folder) if folder.is_dir() else []
    path = Path(capture)
    return _folder_files(path) if path.is_dir() else [CaptureFile(path)]


def _folder_files(folder: Path) -> list[CaptureFile]:
    details = folder / DETAILS_FILE
    if details.is_file():
        try:
            listed = json.loads(details.read_text())
        except (OSError, ValueError):
            listed = None
        if isinstance(listed, dict):
            listed = next((v for v in listed.values() if isinstance(v, list)), None)
        if isinstance(listed, list):
            files = []
            for item in listed:
                if not isinstance(item, dict) or not isinstance(item.get("file"), str):
                    continue
                file = folder / Path(item["file"]).name  # never outside the folder
                size = item.get("batch_size")
                mode = item.get("mode")
                if file.is_file():
                    files.append(
                        CaptureFile(
                            file,
                            size if isinstance(size, int) and not isinstance(size, bool) else None,
                            mode if isinstance(mode, str) else None,
                        )
                    )
            if files:
                return files
    traces = sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))
    return [CaptureFile(p) for p in traces if p.name != DETAILS_FILE]


def needed_files(files: list[CaptureFile], sizes: list[int]) -> list[CaptureFile]:
    """The capture files a replay's steps can use: for each step size, the smallest captured
    size at least it (every mode); files of unknown size always. All when no size is known."""
    if not sizes or all(f.batch_size is None for f in files):
        return files
    known = sorted({f.batch_size for f in files if f.batch_size is not None})
    chosen = set()
    for size in set(sizes):
        fits = [s for s in known if s >= size]
        chosen.add(fits[0] if fits else known[-1])
    return [f for f in files if f.batch_size is None or f.batch_size in chosen]


# -- the two sides ---------------------------------------------------------------------------
def _key(kind: pl.Expr, name: pl.Expr) -> pl.Expr:
    """What a replayed activity and its captured launch share: the kernel's name; a copy or
    a fill only its kind."""
    return (
        pl.when(kind == "memcpy")
        .then(pl.lit("Memcpy"))
        .when(kind == "memset")
        .then(pl.lit("Memset"))
        .otherwise(name)
    )


def _arg(args: pl.Expr, key: str) -> pl.Expr:
    return args.str.json_path_match(f"$['{key}']")


def replayed_kernels(trace: LoadedTrace) -> pl.DataFrame:
    """GPU activities a graph launch replayed, in time order: `event`, `key`, `stream`,
    `ts_ns`, `dur_ns`, `graph_launch` (the launch call's event), `launch_ts_ns`,
    `graph_node_id` (where the trace records it)."""
    calls = trace.select("runtime", "event", "name").filter(
        pl.col("name").str.contains(GRAPH_LAUNCH)
    )
    kernels = trace.select(
        "kernels",
        "event",
        "kind",
        "name",
        "stream",
        "ts_ns",
        "dur_ns",
        "runtime_event",
        "launch_ts_ns",
    )
    replayed = kernels.join(
        calls.select(pl.col("event").cast(pl.Int64).alias("runtime_event")),
        on="runtime_event",
        how="semi",
    ).sort("ts_ns", "stream")
    args = trace.select("events", "event", "args").join(
        replayed.select("event"), on="event", how="semi"
    )
    node = _arg(pl.col("args"), "graph node id").cast(pl.Int64, strict=False)
    args = args.select("event", node.alias("graph_node_id"))
    return replayed.join(args, on="event", how="left", maintain_order="left").select(
        "event",
        _key(pl.col("kind"), pl.col("name")).alias("key"),
        "stream",
        "ts_ns",
        "dur_ns",
        pl.col("runtime_event").alias("graph_launch"),
        "launch_ts_ns",
        "graph_node_id",
    )


def capture_nodes(capture: Capture) -> pl.DataFrame:
    """The captured launches (graph nodes) of a capture trace: `graph` (one per capture
    window, in time order), `position` in it, `key` (kernel name; null when the launch
    does not name it), `launch_event`, the op that made it (`capture_op_event`,
    `capture_op_name`, `capture_op_shapes`), `capture_module`, `batch_size`, `mode`,
    `graph_node_id`."""
    from traceq.relations.link import attribute_modules  # numpy: only when a capture is read

    trace = capture.trace
    runtime = trace.select(
        "runtime", "event", "name", "pid", "tid", "ts_ns", "end_ns", "correlation", "op_event"
    )
    launches = runtime.filter(
        pl.col("name").str.contains(LAUNCH_API) & ~pl.col("name").str.contains(GRAPH_LAUNCH)
    )
    ran = trace.select("kernels", "correlation").drop_nulls().unique()
    captured = launches.join(ran, on="correlation", how="anti")  # ran on no GPU: captured
    windows = _capture_windows(trace, runtime)
    if windows.height:
        captured = (
            captured.sort("ts_ns")
            .join_asof(
                windows.sort("_start"),
                left_on="ts_ns",
                right_on="_start",
                by=["pid", "tid"],
                strategy="backward",
                check_sortedness=False,
            )
            .filter(pl.col("ts_ns") < pl.col("_end"))
        )
    else:
        captured = captured.with_columns(
            pl.lit(0, dtype=pl.Int64).alias("graph"),
            pl.lit(None, dtype=pl.Int64).alias("batch_size"),
            pl.lit(None, dtype=pl.String).alias("mode"),
        )
    if captured.height == 0:
        return pl.DataFrame(schema=_NODES)
    args = trace.select("events", "event", "args").join(
        captured.select("event"), on="event", how="semi"
    )
    args = args.select(
        "event",
        _arg(pl.col("args"), "kernel").alias("_kernel"),
        _arg(pl.col("args"), "graph node id").cast(pl.Int64, strict=False).alias("graph_node_id"),
    )
    kind = (
        pl.when(pl.col("name").str.contains(r"(?i)Memcpy"))
        .then(pl.lit("memcpy"))
        .when(pl.col("name").str.contains(r"(?i)Memset"))
        .then(pl.lit("memset"))
        .otherwise(pl.lit("kernel"))
    )
    ops = trace.select("ops", "event", "name", "input_dims").select(
        pl.col("event").cast(pl.Int64).alias("op_event"),
        pl.col("name").alias("capture_op_name"),
        pl.col("input_dims").alias("capture_op_shapes"),
    )
    modules = trace.select(
        "modules",
        "event",
        "pid",
        "tid",
        "ts_ns",
        "dur_ns",
        "end_ns",
        "python_id",
        "module",
        "path",
        "parent",
        "depth",
    )
    nodes = (
        captured.join(args, on="event", how="left")
        .with_columns(_key(kind, pl.col("_kernel")).alias("key"))
        .join(ops, on="op_event", how="left")
        .sort("graph", "ts_ns")
    )
    nodes = nodes.with_columns(attribute_modules(nodes, modules).alias("capture_module"))
    return nodes.select(
        pl.col("graph").cast(pl.Int64),
        pl.int_range(pl.len()).over("graph").cast(pl.Int64).alias("position"),
        "key",
        pl.col("event").cast(pl.Int64).alias("launch_event"),
        pl.col("op_event").alias("capture_op_event"),
        "capture_op_name",
        "capture_op_shapes",
        "capture_module",
        pl.col("batch_size").cast(pl.Int64).fill_null(capture.batch_size),
        pl.col("mode").fill_null(capture.mode),
        "graph_node_id",
    )


_NODES = {
    "graph": pl.Int64,
    "position": pl.Int64,
    "key": pl.String,
    "launch_event": pl.Int64,
    "capture_op_event": pl.Int64,
    "capture_op_name": pl.String,
    "capture_op_shapes": pl.String,
    "capture_module": pl.String,
    "batch_size": pl.Int64,
    "mode": pl.String,
    "graph_node_id": pl.Int64,
}


def _capture_windows(trace: LoadedTrace, runtime: pl.DataFrame) -> pl.DataFrame:
    """`cudaStreamBeginCapture` .. `cudaStreamEndCapture` per thread, paired in order:
    `pid`, `tid`, `_start`, `_end`, `graph`, and the `batch_size`/`mode` of the
    `capture_<size>_<mode>` range around it (null without one)."""

    def calls(pattern: str) -> pl.DataFrame:
        return (
            runtime.filter(pl.col("name").str.contains(pattern))
            .sort("ts_ns")
            .with_columns(pl.int_range(pl.len()).over("pid", "tid").alias("_nth"))
        )

    begins = calls(r"(?i)StreamBeginCapture").select(
        "pid", "tid", "_nth", pl.col("ts_ns").alias("_start")
    )
    ends = calls(r"(?i)StreamEndCapture").select(
        "pid", "tid", "_nth", pl.col("end_ns").alias("_end")
    )
    windows = begins.join(ends, on=["pid", "tid", "_nth"]).sort("_start")
    windows = windows.with_columns(pl.int_range(pl.len()).cast(pl.Int64).alias("graph"))
    marks = trace.select("annotations", "name", "kind", "pid", "tid", "ts_ns", "end_ns").filter(
        (pl.col("kind") == "cpu") & pl.col("name").str.contains(CAPTURE_RANGE)
    )
    named = marks.select(
        "pid",
        "tid",
        pl.col("ts_ns").alias("_mark"),
        pl.col("end_ns").alias("_mark_end"),
        pl.col("name").str.extract(CAPTURE_RANGE, 1).cast(pl.Int64).alias("batch_size"),
        pl.col("name").str.extract(CAPTURE_RANGE, 2).str.to_uppercase().alias("mode"),
    )
    found = windows.sort("_start").join_asof(
        named.sort("_mark"),
        left_on="_start",
        right_on="_mark",
        by=["pid", "tid"],
        strategy="backward",
        check_sortedness=False,
    )
    inside = pl.col("_start") < pl.col("_mark_end")
    return found.select(
        "pid",
        "tid",
        "_start",
        "_end",
        "graph",
        pl.when(inside).then("batch_size").alias("batch_size"),
        pl.when(inside).then("mode").alias("mode"),
    )


# -- alignment -------------------------------------------------------------------------------
Replayed = tuple[tuple[int, str | None, int | None], ...]  # (stream, key, graph node id)
Captured = tuple[tuple[str | None, int | None], ...]  # (key, graph node id)


@lru_cache(maxsize=4096)
def align(replayed: Replayed, captured: Captured) -> tuple[tuple[int, str], ...]:
    """For each replayed kernel (in time order), the position of its captured launch (-1:
    none) and the method that paired them. See the module's table."""
    n, m = len(replayed), len(captured)
    found = [-1] * n
    method = ["launch"] * n
    taken = [False] * m
    nodes = {node: j for j, (_, node) in enumerate(captured) if node is not None}
    for i, (_, _, node) in enumerate(replayed):
        j = nodes.get(node) if node is not None else None
        if j is not None and not taken[j]:
            found[i], method[i], taken[j] = j, "graph-node-id", True
    rest = [i for i in range(n) if found[i] < 0]
    free = [j for j in range(m) if not taken[j]]
    if rest and len(rest) == len(free):
        pairs = list(zip(rest, free, strict=True))
        if all(captured[j][0] in (None, replayed[i][1]) for i, j in pairs):
            unnamed = any(captured[j][0] is None for _, j in pairs)
            for i, j in pairs:
                found[i], taken[j] = j, True
                method[i] = "capture-order-unnamed" if unnamed else "capture-order"
            return tuple(zip(found, method, strict=True))
    by_stream: dict[int, list[int]] = defaultdict(list)
    for i in rest:
        by_stream[replayed[i][0]].append(i)
    for stream in sorted(by_stream, key=lambda s: -len(by_stream[s])):  # the largest first
        mine = by_stream[stream]
        free = [j for j in range(m) if not taken[j] and captured[j][0] is not None]
        matcher = SequenceMatcher(
            None, [replayed[i][1] for i in mine], [captured[j][0] for j in free], autojunk=False
        )
        for a, b, size in matcher.get_matching_blocks():
            for offset in range(size):
                i, j = mine[a + offset], free[b + offset]
                found[i], method[i], taken[j] = j, "capture-name-scan", True
    if len({s for s, _, _ in replayed}) == 1:
        _fill_gaps(found, method, taken)
    queues: dict[str | None, list[int]] = defaultdict(list)
    for j in range(m):
        if not taken[j] and captured[j][0] is not None:
            queues[captured[j][0]].append(j)
    for i in range(n):
        if found[i] < 0 and queues.get(replayed[i][1]):
            j = queues[replayed[i][1]].pop(0)
            found[i], method[i], taken[j] = j, "capture-queue", True
    return tuple(zip(found, method, strict=True))


def _fill_gaps(found: list[int], method: list[str], taken: list[bool]) -> None:
    """On one stream: a run of unmatched kernels between two matched ones takes the
    untaken launches between theirs, by position, when the counts agree (a renamed
    kernel)."""
    n, m = len(found), len(taken)
    i = 0
    while i < n:
        if found[i] >= 0:
            i += 1
            continue
        k = i
        while k < n and found[k] < 0:
            k += 1
        low = found[i - 1] + 1 if i > 0 else 0
        high = found[k] if k < n else m
        free = [j for j in range(low, high) if not taken[j]]
        if len(free) == k - i:
            for offset, j in enumerate(free):
                found[i + offset], method[i + offset], taken[j] = j, "capture-order-gap", True
        i = k


def _score(
    counts: Counter[str | None], graph: Counter[str | None], length: int, size: int
) -> tuple:
    overlap = sum((counts & graph).values())
    return (overlap, -abs(length - size))


def attribute(trace: LoadedTrace, captures: list[Capture]) -> pl.DataFrame:
    """Per replayed kernel of `trace`: `event`, `replay_method`, `replay_confidence`, and
    for those paired with a captured launch `capture_source`, `capture_graph`,
    `capture_op_event`, `capture_op_name`, `capture_op_shapes`, `capture_module`."""
    from traceq.relations.inference import inference_steps

    replayed = replayed_kernels(trace)
    if replayed.height == 0:
        return pl.DataFrame(schema=ATTRIBUTION)
    frames = []
    for offset, capture in enumerate(captures):
        nodes = capture_nodes(capture)
        frames.append(
            nodes.with_columns(
                (pl.col("graph") + offset * 1_000_000).alias("graph"),
                pl.lit(capture.source).alias("capture_source"),
            )
        )
    nodes = (
        pl.concat(frames)
        if frames
        else pl.DataFrame(schema={**_NODES, "capture_source": pl.String})
    )
    graphs = _graphs(nodes)
    launches = _launches(trace, replayed, inference_steps(trace))
    events: list[int] = []
    chosen_graph: list[int | None] = []
    positions: list[int | None] = []
    methods: list[str] = []
    for launch in launches.iter_rows(named=True):
        sequence: Replayed = tuple(
            zip(launch["stream"], launch["key"], launch["graph_node_id"], strict=True)
        )
        graph = _choose(graphs, sequence, launch["size"], launch["ordinal"])
        pairs = align(sequence, graphs[graph]["sequence"]) if graph is not None else None
        for index, event in enumerate(launch["event"]):
            events.append(event)
            if pairs is None or pairs[index][0] < 0:
                chosen_graph.append(None)
                positions.append(None)
                methods.append("launch")
            else:
                chosen_graph.append(graph)
                positions.append(pairs[index][0])
                methods.append(pairs[index][1])
    paired = pl.DataFrame(
        {"event": events, "capture_graph": chosen_graph, "position": positions, "_m": methods},
        schema={
            "event": pl.Int64,
            "capture_graph": pl.Int64,
            "position": pl.Int64,
            "_m": pl.String,
        },
    )
    found = paired.join(
        nodes.rename({"graph": "capture_graph"}).drop("key", "graph_node_id"),
        on=["capture_graph", "position"],
        how="left",
        maintain_order="left",
    )
    op_known = replayed.join(
        trace.select("kernels", "event", "op_event"), on="event", how="left"
    ).select(pl.col("event").cast(pl.Int64), pl.col("op_event").is_not_null().alias("_op"))
    found = found.join(op_known, on="event", how="left")
    confidence = pl.col("_m").replace_strict(CONFIDENCE, return_dtype=pl.Float64)
    confidence = (
        pl.when((pl.col("_m") == "launch") & ~pl.col("_op")).then(0.0).otherwise(confidence)
    )
    return found.select(
        pl.col("event").cast(pl.UInt32),
        pl.col("_m").str.replace(r"-(unnamed|gap)$", "").alias("replay_method"),
        confidence.alias("replay_confidence"),
        "capture_source",
        "capture_graph",
        "capture_op_event",
        "capture_op_name",
        "capture_op_shapes",
        "capture_module",
    ).cast(ATTRIBUTION)


def _graphs(nodes: pl.DataFrame) -> dict[int, dict[str, Any]]:
    """Each captured graph: its sequence (key, node id), key counts, batch size, order."""
    graphs: dict[int, dict[str, Any]] = {}
    per_graph = (
        nodes.sort("graph", "position")
        .group_by("graph", maintain_order=True)
        .agg("key", "graph_node_id", pl.col("batch_size").first(), pl.col("mode").first())
    )
    for order, row in enumerate(per_graph.iter_rows(named=True)):
        sequence = tuple(zip(row["key"], row["graph_node_id"], strict=True))
        graphs[row["graph"]] = {
            "sequence": sequence,
            "counts": Counter(row["key"]),
            "batch_size": row["batch_size"],
            "mode": row["mode"],
            "order": order,
        }
    return graphs


def _launches(trace: LoadedTrace, replayed: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """One row per graph launch: its kernels (`event`, `stream`, `key`, `graph_node_id`,
    in time order), the step `size` (tokens, else requests) and its `ordinal` among the
    step's graph launches."""
    per_launch = replayed.group_by("graph_launch", maintain_order=True).agg(
        "event", "stream", "key", "graph_node_id", pl.col("launch_ts_ns").first()
    )
    if steps.height:
        windows = steps.select(
            "step_index",
            pl.col("ts_ns").alias("_start"),
            pl.col("end_ns").alias("_end"),
            pl.coalesce("tokens", "batch_size").alias("size"),
        ).sort("_start")
        per_launch = (
            per_launch.sort("launch_ts_ns")
            .join_asof(
                windows,
                left_on="launch_ts_ns",
                right_on="_start",
                strategy="backward",
                check_sortedness=False,
            )
            .with_columns(
                pl.when(pl.col("launch_ts_ns") < pl.col("_end")).then("size").alias("size"),
                pl.when(pl.col("launch_ts_ns") < pl.col("_end")).then("step_index").alias("_step"),
            )
        )
    else:
        per_launch = per_launch.with_columns(
            pl.lit(None, dtype=pl.Int64).alias("size"), pl.lit(None, dtype=pl.Int64).alias("_step")
        )
    return per_launch.sort("launch_ts_ns").with_columns(
        pl.int_range(pl.len()).over("_step").alias("ordinal")
    )


def _choose(
    graphs: dict[int, dict[str, Any]], sequence: Replayed, size: int | None, ordinal: int
) -> int | None:
    """The captured graph a launch replays: the smallest captured size at least the step's,
    then the best sequence match; ties by the launch's ordinal in its step."""
    if not graphs:
        return None
    candidates = list(graphs)
    sizes = sorted({g["batch_size"] for g in graphs.values() if g["batch_size"] is not None})
    if size is not None and sizes:
        fits = [s for s in sizes if s >= size] or [sizes[-1]]
        candidates = [g for g in candidates if graphs[g]["batch_size"] in (fits[0], None)]
    counts = Counter(key for _, key, _ in sequence)
    scored = [
        (_score(counts, graphs[g]["counts"], len(sequence), len(graphs[g]["sequence"])), g)
        for g in candidates
    ]
    best = max(score for score, _ in scored)
    tied = [g for score, g in scored if score == best]
    return tied[ordinal] if ordinal < len(tied) else tied[0]


# -- the kernels frame -------------------------------------------------------------------------
def with_attribution(
    kernels: pl.DataFrame, ops: pl.DataFrame, attribution: pl.DataFrame
) -> pl.DataFrame:
    """`kernels` with the replay columns: `replay_method`, `replay_confidence` (null on a
    kernel no graph replayed), `capture_source`, `capture_op_event`, and for every kernel
    `op_name` and `op_shapes` (its op's, from the capture for a replayed kernel paired
    with it, else from `op_event`); `module` becomes the capture's where paired. Columns
    already there keep their meaning: `op_event` is still an event of this trace."""
    own = ops.select(
        pl.col("event").cast(pl.Int64).alias("op_event"),
        pl.col("name").alias("_own_name"),
        pl.col("input_dims").alias("_own_shapes"),
    )
    extra = attribution.select(
        "event",
        "replay_method",
        "replay_confidence",
        "capture_source",
        "capture_op_event",
        "capture_op_name",
        "capture_op_shapes",
        "capture_module",
    )
    drop = [c for c in (*extra.columns[1:], "op_name", "op_shapes") if c in kernels.columns]
    joined = (
        kernels.drop(drop)
        .join(extra, on="event", how="left", maintain_order="left")
        .join(own, on="op_event", how="left", maintain_order="left")
    )
    paired = pl.col("capture_op_event").is_not_null() | pl.col("capture_module").is_not_null()
    return joined.with_columns(
        pl.when(paired).then("capture_op_name").otherwise("_own_name").alias("op_name"),
        pl.when(paired).then("capture_op_shapes").otherwise("_own_shapes").alias("op_shapes"),
        pl.when(paired).then("capture_module").otherwise("module").alias("module"),
    ).drop("_own_name", "_own_shapes", "capture_op_name", "capture_op_shapes", "capture_module")


# -- what `info` reports ---------------------------------------------------------------------
def replay_summary(trace: LoadedTrace) -> dict[str, Any]:
    """GPU time graphs replayed and how much of it has an op, by method; empty when no graph
    was replayed. Plain JSON types."""
    calls = trace.select("runtime", "event", "name").filter(
        pl.col("name").str.contains(GRAPH_LAUNCH)
    )
    if calls.height == 0:
        return {}
    kernels = trace.select("kernels", "event", "dur_ns", "runtime_event")
    total_ns = int(kernels["dur_ns"].sum() or 0)
    replayed = kernels.join(
        calls.select(pl.col("event").cast(pl.Int64).alias("runtime_event")),
        on="runtime_event",
        how="semi",
    )
    replay_ns = int(replayed["dur_ns"].sum() or 0)
    if "replay_method" in trace.kernels.columns:
        methods = trace.select("kernels", "event", "replay_method", "replay_confidence")
        replayed = replayed.join(methods, on="event", how="left")
    else:
        replayed = replayed.with_columns(
            pl.lit("launch").alias("replay_method"),
            pl.lit(None, dtype=pl.Float64).alias("replay_confidence"),
        )
    by_method = (
        replayed.group_by("replay_method")
        .agg(pl.len().alias("kernels"), pl.col("dur_ns").sum().alias("ns"))
        .sort("ns", descending=True)
    )
    attributed = by_method.filter(pl.col("replay_method") != "launch")
    attributed_ns = int(attributed["ns"].sum() or 0)
    sources = []
    if "captures" in trace.frames:
        sources = trace.frames["captures"].to_dicts()
    return {
        "graph_launches": calls.height,
        "replayed_kernels": replayed.height,
        "replayed_us": round(replay_ns / 1000, 3),
        "replayed_share": round(replay_ns / total_ns, 4) if total_ns else 0.0,
        "attributed_us": round(attributed_ns / 1000, 3),
        "attributed_share": round(attributed_ns / replay_ns, 4) if replay_ns else 0.0,
        "by_method": {
            row["replay_method"]: {
                "kernels": row["kernels"],
                "us": round(row["ns"] / 1000, 3),
                "share": round(row["ns"] / replay_ns, 4) if replay_ns else 0.0,
            }
            for row in by_method.iter_rows(named=True)
        },
        "captures": sources,
    }


def kernels_without_launch(trace: LoadedTrace) -> dict[str, Any]:
    """GPU activities no runtime call launched: how many, their GPU time, and why, where
    the trace says (`reasons`: count and µs per reason). Empty when every one has one."""
    kernels = trace.select("kernels", "event", "correlation", "ts_ns", "dur_ns", "runtime_event")
    orphans = kernels.filter(pl.col("runtime_event").is_null())
    if orphans.height == 0:
        return {}
    runtime = trace.select("runtime", "ts_ns", "correlation")
    first_call = runtime["ts_ns"].min()
    args = trace.select("events", "event", "args").join(
        orphans.select("event"), on="event", how="semi"
    )
    graph = args.select(
        "event",
        (
            _arg(pl.col("args"), "graph node id").is_not_null()
            | _arg(pl.col("args"), "graph id").is_not_null()
        ).alias("_graph"),
    )
    reason = (
        pl.when(pl.col("_graph"))
        .then(pl.lit("graph replay (its graph launch is not in the trace)"))
        .when(pl.col("correlation").is_null() | (pl.col("correlation") == 0))
        .then(pl.lit("no correlation recorded"))
        .when(pl.lit(runtime.height == 0))
        .then(pl.lit("no runtime calls recorded"))
        .when(pl.col("ts_ns") < pl.lit(first_call))
        .then(pl.lit("launched before the trace began"))
        .otherwise(pl.lit("launch missing (dropped CPU buffer or flows)"))
    )
    reasons = (
        orphans.join(graph, on="event", how="left")
        .with_columns(pl.col("_graph").fill_null(False), reason.alias("reason"))
        .group_by("reason")
        .agg(pl.len().alias("kernels"), pl.col("dur_ns").sum().alias("ns"))
        .sort("ns", descending=True)
    )
    return {
        "kernels": orphans.height,
        "us": round(int(orphans["dur_ns"].sum() or 0) / 1000, 3),
        "reasons": {
            row["reason"]: {"kernels": row["kernels"], "us": round(row["ns"] / 1000, 3)}
            for row in reasons.iter_rows(named=True)
        },
    }
