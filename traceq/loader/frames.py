"""Splits the raw event frame into the typed frames users query: ops, kernels, runtime, ...

Each frame keeps the `event` column (the entry's index in `traceEvents`) so any row leads
back to its raw event and `args` in `Trace.events`. Columns are named in the trace's own
words (`correlation`, `external_id`, `stream`) with units in the name (`ts_ns`, `dur_ns`).
Arguments are pulled out of `args` by a second NDJSON parse of just that frame's `args`
text, which stays robust when a field's type varies (Kineto writes `stream` as an int,
ROCm runtime calls as "0x0").
"""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

# Which frame each event category lands in (lower-cased `cat`; phases handled apart).
OP_CATS = ("cpu_op", "operator")
GPU_CATS = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "mtia_ccp_events": "kernel",
}
RUNTIME_CATS = {
    "cuda_runtime": "runtime",
    "runtime": "runtime",
    "cuda_driver": "driver",
    "mtia_runtime": "runtime",
}
ANNOTATION_CATS = {"user_annotation": "cpu", "gpu_user_annotation": "gpu"}
PYTHON_CATS = ("python_function",)
CATEGORY_KEY = "_cat"
SYNC_CATS = ("cuda_sync",)
FLOW_PHASES = ("s", "t", "f")
INSTANT_PHASES = ("i", "I")
# ASCII digits only: `\d` would also take `٣` (Arabic-Indic three), which no cast reads.
STEP_NAME = r"^ProfilerStep#([0-9]+)$"
MODULE_PREFIX = "nn.Module: "

# JSON lists of integers, exactly: Polars' JSON decoder fails (it does not return null) on
# text such as `[1,,2]`, `[-]` or a number of 40 digits (what `1e300` reads back as), so
# nothing else may reach it. 19 digits or fewer: an i64, or a null where it overflows.
_INT = r"\s*-?\d{1,19}\s*"
_INT_LIST = rf"\[(?:{_INT}(?:,{_INT})*|\s*)\]"
_INT_LIST_TEXT = rf"^{_INT_LIST}$"
_SHAPE_TEXT = rf"^\[(?:\s*{_INT_LIST}\s*(?:,\s*{_INT_LIST}\s*)*|\s*)\]$"  # nothing deeper
# JSON strings, comma-separated, with JSON's escapes only: control characters and stray
# backslashes (Polars writes them back unescaped, then cannot read them) leave the list
# null; the event's `args` keep the text.
_STR = r'\s*"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"\s*'
_STR_LIST_TEXT = rf"^\[(?:{_STR}(?:,{_STR})*|\s*)\]$"


ARGS_ROWS = 100_000  # rows of `args` text parsed at a time


def args_frame(
    args: pl.Series, fields: dict[str, str], integers: Collection[str] = ()
) -> pl.DataFrame:
    """Text of the chosen `args` keys, one column each (renamed), row-aligned with `args`;
    the keys in `integers` (read only through `as_int`) as Int64 instead.

    A frame asks for up to 16 keys and most are absent (the ops of a trace without shapes:
    7 of 10), while a parsed String column costs 16 bytes a row even when null. So the text
    is joined and parsed `ARGS_ROWS` rows at a time (joined whole, the kernels' `args` of
    2.16M events were two copies of 67 MB held at once), a key is parsed only where its
    quoted name occurs in the text (any backslash: every key, as a key may be escaped), and
    a key null in every row is stored as one broadcast null: 90 MB less peak on that trace.
    Integer keys are read as Int64 by the JSON parser itself: as text, each number was
    formatted into a string only for `as_int` to parse it back (a tenth of a cold load's
    instructions), at twice the memory.
    """
    schema = {key: pl.Int64() if key in integers else pl.String() for key in fields}
    if args.len() == 0:
        return pl.DataFrame(schema=schema).rename(fields)
    parts, present = [], set()
    for at in range(0, args.len(), ARGS_ROWS):
        part = _parse_args(args.slice(at, ARGS_ROWS), schema)
        empty = {key for key in schema if part[key].null_count() == part.height}
        present |= set(schema) - empty
        parts.append(part.with_columns(pl.lit(None, schema[key]).alias(key) for key in empty))
    if present:
        parsed = pl.concat([part.select(k for k in schema if k in present) for part in parts])
        parsed = parsed.rechunk()
    else:
        parsed = args.to_frame()  # for its height
    absent = [pl.lit(None, schema[key]).alias(key) for key in schema if key not in present]
    return parsed.with_columns(absent).select(list(schema)).rename(fields)


def _parse_args(args: pl.Series, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """The keys of `schema` in `args`; those whose name is nowhere in the text are null
    without being parsed. The parser refuses anything but a JSON integer for an Int64 key
    (a string "0x0", 3.0, a number past int64): then the rows are read again as text and
    those keys go through `as_int`, as every key did before."""
    text = args.fill_null("{}").str.join("\n").cast(pl.Binary).item()  # no str round trip
    escaped = b"\\" in text
    found = {key: dtype for key, dtype in schema.items() if escaped or _quoted(key) in text}
    if not found:
        parsed = args.to_frame()
    else:
        try:
            parsed = pl.read_ndjson(text, schema=found)
        except pl.exceptions.PolarsError:
            as_text = dict.fromkeys(found, pl.String())
            integers = [key for key, dtype in found.items() if dtype == pl.Int64]
            parsed = pl.read_ndjson(text, schema=as_text).with_columns(
                as_int(key).alias(key) for key in integers
            )
    missing = (pl.lit(None, dtype).alias(key) for key, dtype in schema.items() if key not in found)
    return parsed.with_columns(missing).select(list(schema))


def _quoted(key: str) -> bytes:
    return b'"' + key.encode() + b'"'


def as_int(column: str) -> pl.Expr:
    """Integer from text such as '7', 'stream 7' or '3.0'; null when there is none."""
    return pl.col(column).map_batches(_to_int, return_dtype=pl.Int64)


def _to_int(values: pl.Series) -> pl.Series:
    """`as_int` on a whole column. Nearly every value is a plain integer, so the slower
    readings run only when some text is left over: as expressions they were computed for
    every row (four temporary columns per field, ~150 MB of peak on the ops of 2.16M events)."""
    if values.dtype.is_integer():  # read as Int64 by `args_frame`
        return values.cast(pl.Int64)
    text = values.cast(pl.String)  # `pid` and `tid` are Categorical in the events
    plain = text.cast(pl.Int64, strict=False)
    if plain.null_count() == text.null_count():
        return plain
    rest = text.str.strip_chars()
    return (
        plain.fill_null(rest.cast(pl.Int64, strict=False))
        .fill_null(rest.cast(pl.Float64, strict=False).cast(pl.Int64, strict=False))
        .fill_null(rest.str.extract(r"(-?\d+)$").cast(pl.Int64, strict=False))
    )


def as_float(column: str) -> pl.Expr:
    return pl.col(column).cast(pl.Float64, strict=False)


def int_list(column: str) -> pl.Expr:
    """'[24, 1, 1]' -> [24, 1, 1]; an item past int64 is null, other text is no list."""
    return _integers(_matching(pl.col(column), _INT_LIST_TEXT))


def shapes(column: str) -> pl.Expr:
    """'[[8, 768], [], [1]]' -> [[8, 768], [], [1]]; deeper nesting (tensor lists) -> null."""
    shape = _matching(pl.col(column), _SHAPE_TEXT)
    inside = shape.str.slice(1, shape.str.len_chars() - 2)  # within the outer brackets
    return inside.str.extract_all(r"\[[^\[\]]*\]").list.eval(_integers(pl.element()))


def _matching(text: pl.Expr, pattern: str) -> pl.Expr:
    """`text` where it matches `pattern`, else null: the list readings read only the rows
    their regex accepts, so no reader sees text it was not meant for."""
    return pl.when(text.str.contains(pattern)).then(text)


def _integers(text: pl.Expr) -> pl.Expr:
    """The integers of a list's text that `_INT_LIST` has matched, as Int64 (null past
    int64). Its digits are picked out and cast, not read by `str.json_decode`: that held
    120-180 MiB to read the `grid` and `block` of 223k kernels, in the link at the load's
    peak (and 330 MiB for the shapes of 600k ops), and raised on text the regexes let
    through that is not JSON ('[007]', a no-break space)."""
    return text.str.extract_all(r"-?\d+").cast(pl.List(pl.Int64), strict=False)


def str_list(column: str) -> pl.Expr:
    """'["float", "c10::BFloat16"]' -> ["float", "c10::BFloat16"]."""
    return pl.col(column).map_batches(_to_str_list, return_dtype=pl.List(pl.String))


def _to_str_list(values: pl.Series) -> pl.Series:
    """`str_list` on a whole column. Without a backslash in it, no string holds an escape
    or a quote, so each is the text between two quotes, picked out as `_integers` picks
    digits (`str.json_decode` held 90 MiB for the types of 600k ops); with one, JSON's
    decoder reads the escapes."""
    listed = _matching(pl.col(values.name), _STR_LIST_TEXT)
    if values.str.contains("\\", literal=True).any():
        strings = listed.str.json_decode(pl.List(pl.String))
    else:
        quoted = pl.element().str.slice(1, pl.element().str.len_chars() - 2)
        strings = listed.str.extract_all(r'"[^"]*"').list.eval(quoted)
    return values.to_frame().select(strings).to_series()


_ROW_COLUMNS = ("event", "name", "pid", "tid", "ts_ns", "dur_ns", "args", CATEGORY_KEY)


def _complete(events: pl.DataFrame, cats: object) -> pl.DataFrame:
    """The complete events (ph X) of the given categories, with only the columns the typed
    frames read: filtering the whole events frame copied all 20 columns' 16-byte views
    (+90 MB of RSS for the ops alone on 2.16M events). In one chunk: the filter returns
    many, the parsed `args` one, and a frame of both was rechunked whole by the first
    query that added a column to it (+28 MB at the end of the link, 2.16M events)."""
    complete = (pl.col("ph") == "X") & _cat().is_in(cats)
    return events.lazy().filter(complete).select(_ROW_COLUMNS).collect().rechunk()


def _base(events: pl.DataFrame) -> pl.DataFrame:
    return events.select(
        "event",
        "name",
        as_int("pid").alias("pid"),
        as_int("tid").alias("tid"),
        "ts_ns",
        "dur_ns",
        (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).alias("end_ns"),
    )


def _with_args(
    base: pl.DataFrame, args: pl.Series, fields: dict[str, str], integers: Collection[str]
) -> pl.DataFrame:
    return pl.concat([base, args_frame(args, fields, integers)], how="horizontal")


def with_category_key(events: pl.DataFrame) -> pl.DataFrame:
    """Add the lower-cased `cat` every frame filters on (old traces write `Kernel`), once:
    lower-casing millions of strings in each frame's filter cost half a second. `cat` has
    a few distinct values, so those are lower-cased, not every row's."""
    names = events["cat"].unique().drop_nulls().cast(pl.String).to_list()
    lower = pl.col("cat").replace_strict(
        {name: name.lower() for name in names}, default=None, return_dtype=pl.Categorical
    )
    return events.with_columns(lower.alias(CATEGORY_KEY))


def _cat() -> pl.Expr:
    return pl.col(CATEGORY_KEY)


def ops(events: pl.DataFrame) -> pl.DataFrame:
    """CPU operators (`aten::*`, autograd nodes, record_function ranges recorded as ops)."""
    rows = _complete(events, OP_CATS)
    fields = {
        "External id": "_external_id",
        "external id": "_external_id_old",
        "Sequence number": "_sequence_number",
        "Fwd thread id": "_fwd_thread_id",
        "Record function id": "_record_function_id",
        "Input Dims": "input_dims",
        "Input dims": "_input_dims_old",
        "Input type": "_input_types",
        "Input Strides": "_input_strides",
        "Concrete Inputs": "_concrete_inputs",
    }
    integers = list(fields)[:5]  # the ids, not the shapes and types
    df = _with_args(_base(rows), rows["args"], fields, integers)
    return (
        df.with_columns(
            pl.coalesce(as_int("_external_id"), as_int("_external_id_old")).alias("external_id"),
            as_int("_sequence_number").alias("sequence_number"),
            as_int("_fwd_thread_id").alias("fwd_thread_id"),
            as_int("_record_function_id").alias("record_function_id"),
            pl.coalesce("input_dims", "_input_dims_old").alias("input_dims"),
        )
        .with_columns(
            shapes("input_dims").alias("shapes"),
            str_list("_input_types").alias("input_types"),
            shapes("_input_strides").alias("input_strides"),
            str_list("_concrete_inputs").alias("concrete_inputs"),
        )
        .drop(pl.selectors.starts_with("_"))
    )


def kernels(events: pl.DataFrame) -> pl.DataFrame:
    """GPU activities: kernels, memcpys and memsets, each on a device and stream."""
    rows = _complete(events, list(GPU_CATS))
    fields = {
        "device": "_device",
        "stream": "_stream",
        "correlation": "_correlation",
        "External id": "_external_id",
        "external id": "_external_id_old",
        "grid": "_grid",
        "block": "_block",
        "registers per thread": "_registers",
        "shared memory": "_shared_memory",
        "blocks per SM": "_blocks_per_sm",
        "warps per SM": "_warps_per_sm",
        "est. achieved occupancy %": "_occupancy",
        "bytes": "_bytes",
        "memory bandwidth (GB/s)": "_bandwidth",
        "queued": "_queued",
        "context": "_context",
    }
    integers = [key for key, name in fields.items() if name in _KERNEL_INTEGERS]
    df = _with_args(_base(rows), rows["args"], fields, integers)
    kind = rows.select(_cat().replace_strict(GPU_CATS, default="kernel").alias("kind"))
    return pl.concat([df, kind], how="horizontal").select(
        "event",
        "kind",
        "name",
        pl.coalesce(as_int("_device"), pl.col("pid")).alias("device"),
        pl.coalesce(as_int("_stream"), pl.col("tid")).alias("stream"),
        "ts_ns",
        "dur_ns",
        "end_ns",
        as_int("_correlation").alias("correlation"),
        pl.coalesce(as_int("_external_id"), as_int("_external_id_old")).alias("external_id"),
        int_list("_grid").alias("grid"),
        int_list("_block").alias("block"),
        as_int("_registers").alias("registers_per_thread"),
        as_int("_shared_memory").alias("shared_memory"),
        as_float("_blocks_per_sm").alias("blocks_per_sm"),
        as_float("_warps_per_sm").alias("warps_per_sm"),
        as_float("_occupancy").alias("occupancy_pct"),
        as_int("_bytes").alias("bytes"),
        as_float("_bandwidth").alias("bandwidth_gbs"),
        as_int("_queued").alias("queued"),
        as_int("_context").alias("context"),
    )


_KERNEL_INTEGERS = (
    "_device",
    "_stream",
    "_correlation",
    "_external_id",
    "_external_id_old",
    "_registers",
    "_shared_memory",
    "_bytes",
    "_queued",
    "_context",
)


def runtime(events: pl.DataFrame) -> pl.DataFrame:
    """Host-side runtime and driver calls (`cudaLaunchKernel`, `hipMemcpyAsync`, ...)."""
    rows = _complete(events, list(RUNTIME_CATS))
    fields = {
        "correlation": "_correlation",
        "External id": "_external_id",
        "external id": "_external_id_old",
        "cbid": "_cbid",
        "cid": "_cid",
        "stream": "stream_arg",
    }
    df = _with_args(_base(rows), rows["args"], fields, list(fields)[:-1])  # `stream` stays text
    kind = rows.select(_cat().replace_strict(RUNTIME_CATS, default="runtime").alias("kind"))
    return pl.concat([df, kind], how="horizontal").select(
        "event",
        "kind",
        "name",
        "pid",
        "tid",
        "ts_ns",
        "dur_ns",
        "end_ns",
        as_int("_correlation").alias("correlation"),
        pl.coalesce(as_int("_external_id"), as_int("_external_id_old")).alias("external_id"),
        pl.coalesce(as_int("_cbid"), as_int("_cid")).alias("cbid"),
        "stream_arg",
    )


def annotations(events: pl.DataFrame) -> pl.DataFrame:
    """`record_function` ranges on the CPU and their mirrors on GPU streams."""
    rows = _complete(events, list(ANNOTATION_CATS))
    fields = {"External id": "_external_id", "device": "_device", "stream": "_stream"}
    df = _with_args(_base(rows), rows["args"], fields, list(fields))
    kind = rows.select(_cat().replace_strict(ANNOTATION_CATS).alias("kind"))
    return pl.concat([df, kind], how="horizontal").select(
        "event",
        "kind",
        "name",
        "pid",
        "tid",
        "ts_ns",
        "dur_ns",
        "end_ns",
        as_int("_external_id").alias("external_id"),
        pl.when(pl.col("kind") == "gpu")
        .then(pl.coalesce(as_int("_device"), "pid"))
        .alias("device"),
        pl.when(pl.col("kind") == "gpu")
        .then(pl.coalesce(as_int("_stream"), "tid"))
        .alias("stream"),
    )


def steps(events: pl.DataFrame) -> pl.DataFrame:
    """`ProfilerStep#N` windows on the CPU; every op and kernel is attributed to one.

    N is what the profiler writes: ASCII digits of a number that fits 64 bits. A name of
    another shape (`ProfilerStep#٣`, `ProfilerStep#99999999999999999999`) marks no step:
    the range stays the annotation it also is, as any `record_function` name would."""
    rows = events.filter(
        (pl.col("ph") == "X")
        & (_cat() != "gpu_user_annotation")
        & pl.col("name").str.contains(STEP_NAME)
    )
    number = pl.col("name").str.extract(STEP_NAME).cast(pl.Int64, strict=False)
    return (
        _base(rows)
        .with_columns(number.alias("step"))
        .filter(pl.col("step").is_not_null())
        .unique("step", keep="first", maintain_order=True)
        .sort("ts_ns")
        .select("step", "event", "name", "pid", "tid", "ts_ns", "dur_ns", "end_ns")
    )


def python(events: pl.DataFrame) -> pl.DataFrame:
    """Python frames (`with_stack`) and `nn.Module` calls (`with_modules`)."""
    rows = _complete(events, PYTHON_CATS)
    fields = {
        "Python id": "_python_id",
        "Python parent id": "_python_parent_id",
        "Python thread": "_python_thread",
        "Python module id": "_python_module_id",
    }
    df = _with_args(_base(rows), rows["args"], fields, list(fields))
    return df.select(
        "event",
        "name",
        "pid",
        "tid",
        "ts_ns",
        "dur_ns",
        "end_ns",
        as_int("_python_id").alias("python_id"),
        as_int("_python_parent_id").alias("python_parent_id"),
        as_int("_python_thread").alias("python_thread"),
        as_int("_python_module_id").alias("python_module_id"),
        pl.col("name").str.starts_with(MODULE_PREFIX).alias("is_module"),
    )


def syncs(events: pl.DataFrame) -> pl.DataFrame:
    """CUDA synchronization records (`cuda_sync`): event syncs and cross-stream waits."""
    rows = _complete(events, SYNC_CATS)
    fields = {
        "cuda_sync_kind": "sync_kind",
        "device": "_device",
        "stream": "_stream",
        "correlation": "_correlation",
        "External id": "_external_id",
        "wait_on_stream": "_wait_on_stream",
        "wait_on_cuda_event_record_corr_id": "_wait_on_record",
        "event": "_cuda_event",
    }
    df = _with_args(_base(rows), rows["args"], fields, list(fields)[1:])  # not `cuda_sync_kind`
    return df.select(
        "event",
        "name",
        "sync_kind",
        pl.coalesce(as_int("_device"), "pid").alias("device"),
        pl.coalesce(as_int("_stream"), "tid").alias("stream"),
        "ts_ns",
        "dur_ns",
        "end_ns",
        as_int("_correlation").alias("correlation"),
        as_int("_external_id").alias("external_id"),
        as_int("_wait_on_stream").alias("wait_on_stream"),
        as_int("_wait_on_record").alias("wait_on_record_correlation"),
        as_int("_cuda_event").alias("cuda_event"),
    )


def flow_points(events: pl.DataFrame) -> pl.DataFrame:
    """Flow start/step/end points (`ac2g`, `fwdbwd`, old `async`): one row per point."""
    rows = events.filter(pl.col("ph").is_in(FLOW_PHASES))
    return rows.select(
        "event",
        "ph",
        "cat",
        "name",
        pl.col("id").alias("flow_id"),
        as_int("pid").alias("pid"),
        as_int("tid").alias("tid"),
        "ts_ns",
        "bp",
    )


def flows(points: pl.DataFrame) -> pl.DataFrame:
    """Start and end of each flow, paired by (category, id); a missing end stays null.

    Same every run: by start time, then start event (unique; every start has a time),
    then flows without a start by end event. The starts are put in that order before the
    join, which keeps it (left rows in order, then the right rows it did not match):
    sorting the joined frame instead copied all of it twice."""
    first = pl.struct("cat", "flow_id").is_first_distinct()  # `unique`'s rows, 3x faster
    start = points.filter(pl.col("ph") == "s").filter(first).sort("ts_ns", "event", nulls_last=True)
    end = points.filter(pl.col("ph") == "f").filter(first)
    cols = ["event", "pid", "tid", "ts_ns"]
    return (
        start.select("cat", "flow_id", *cols)
        .join(
            end.select("cat", "flow_id", *cols),
            on=["cat", "flow_id"],
            how="full",
            coalesce=True,
            suffix="_end",
            maintain_order="left_right",
        )
        .rename(
            {
                "event": "start_event",
                "pid": "start_pid",
                "tid": "start_tid",
                "ts_ns": "start_ts_ns",
                "event_end": "end_event",
                "pid_end": "end_pid",
                "tid_end": "end_tid",
                "ts_ns_end": "end_ts_ns",
            }
        )
    )


def counters(events: pl.DataFrame) -> pl.DataFrame:
    """Counter samples (ph C); the values stay in `args`."""
    rows = events.filter(pl.col("ph") == "C")
    return rows.select("event", "name", as_int("pid").alias("pid"), "ts_ns", "args")


def instants(events: pl.DataFrame) -> pl.DataFrame:
    """Instant events (memory allocations `[memory]`, iteration marks, ...)."""
    rows = events.filter(pl.col("ph").is_in(INSTANT_PHASES))
    return rows.select(
        "event",
        "cat",
        "name",
        as_int("pid").alias("pid"),
        as_int("tid").alias("tid"),
        "ts_ns",
        pl.col("s").alias("scope"),
    )


def threads(events: pl.DataFrame) -> pl.DataFrame:
    """Metadata events (ph M): process and thread names, sort indices, labels."""
    rows = events.filter(pl.col("ph") == "M")
    values = args_frame(rows["args"], {"name": "_name", "sort_index": "_sort", "labels": "_labels"})
    return pl.concat([rows.select("event", "name", "pid", "tid"), values], how="horizontal").select(
        "event",
        pl.col("name").alias("kind"),
        as_int("pid").alias("pid"),
        as_int("tid").alias("tid"),
        pl.col("pid").alias("pid_text"),
        pl.col("tid").alias("tid_text"),
        pl.coalesce("_name", "_labels", "_sort").alias("value"),
    )


def modeled() -> pl.Expr:
    """True for events that one of the frames above models."""
    cat = _cat()
    known = (
        list(OP_CATS)
        + list(GPU_CATS)
        + list(RUNTIME_CATS)
        + list(ANNOTATION_CATS)
        + list(PYTHON_CATS)
        + list(SYNC_CATS)
    )
    modeled_x = (pl.col("ph") == "X") & cat.is_in(known)
    by_phase = pl.col("ph").is_in([*FLOW_PHASES, *INSTANT_PHASES, "C", "M"])
    # A missing `cat` makes the comparison null; such an event is not modeled, not lost.
    return (modeled_x | by_phase).fill_null(False)


def other(events: pl.DataFrame) -> pl.DataFrame:
    """Events no frame models (e.g. `Trace` spans, CUPTI ranges, unknown categories)."""
    return events.filter(~modeled()).select(
        "event", "ph", "cat", "name", "pid", "tid", "ts_ns", "dur_ns"
    )
