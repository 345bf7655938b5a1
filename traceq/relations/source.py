"""Where in the user's code an op was issued: the Python frame a finding points at.

A trace recorded `with_stack=True` holds the Python call stack as `python_function` events
(`trace.python`): each frame named `file(line): function`, nested in time on its thread,
around the ops it issued. The frame a person can act on is the innermost one in their own
code, not in torch, the standard library or an installed library (`is_library`); when the
stack holds none (a model from `transformers` driven by its own `generate` or `Trainer`),
the innermost `forward` of a `transformers` model stands in.

The profiler names a frame by the line it starts on (its `def`), not the line of each
call inside it, so `line` is where that function starts. Its `file` is as the profiler
wrote it: shortened by the `sys.path` entry it was found under (`model.py`,
`torch/nn/modules/linear.py`), absolute otherwise.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

if TYPE_CHECKING:
    from traceq.loader.loaded import LoadedTrace

FRAME_NAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<function>.+)$")
LIBRARIES = frozenset(
    {
        "torch",
        "torchvision",
        "torchaudio",
        "functorch",
        "triton",
        "transformers",
        "accelerate",
        "diffusers",
        "peft",
        "timm",
        "deepspeed",
        "lightning",
        "pytorch_lightning",
        "huggingface_hub",
        "safetensors",
        "tokenizers",
        "numpy",
        "traceq",
        "_pytest",
        "pytest",
        "pluggy",
        "IPython",
        "ipykernel",
        "tqdm",
        "typing_extensions",
    }
)
"""Top-level packages whose frames are never the user's code (the standard library's are
found from `sys.stdlib_module_names`)."""
INSTALLED = ("site-packages/", "dist-packages/", "/lib/python3", "\\lib\\python3")
FALLBACK_PACKAGE = "transformers/"


def parse_frame(name: str) -> dict[str, Any] | None:
    """`{"file", "line", "function"}` of a `python_function` event's name, or None for a
    frame with no file (`<built-in method ...>`, `nn.Module: Linear_0`)."""
    match = FRAME_NAME.match(name)
    if match is None or match["file"].startswith("<"):
        return None
    return {"file": match["file"], "line": int(match["line"]), "function": match["function"]}


def is_library(file: str) -> bool:
    """Whether a frame's file is torch's, the standard library's or an installed package's
    (as the profiler shortens paths: `torch/nn/modules/module.py`, `contextlib.py`)."""
    path = file.replace("\\", "/")
    if path.startswith("<") or any(marker in path for marker in INSTALLED):
        return True
    top = path.lstrip("/").split("/", 1)[0]
    top = top[:-3] if top.endswith(".py") else top
    return top in LIBRARIES or top in sys.stdlib_module_names


def source_of(trace: LoadedTrace, ops: Iterable[int]) -> dict[int, dict[str, Any]]:
    """Per op (event id): the frame of the user's code around it (`{"file", "line",
    "function"}`), or the innermost `transformers` `forward` when no user frame is; ops
    with neither are left out. Empty when the trace holds no Python frames."""
    wanted = sorted(set(ops))
    python = trace.python
    if not wanted or python.height == 0:
        return {}
    frames = (
        python.select("name", "tid", "ts_ns", "end_ns", "python_id", "python_parent_id")
        .drop_nulls(["ts_ns", "end_ns"])
        .sort("tid", "ts_ns", pl.col("end_ns"), descending=[False, False, True])
    )
    names = frames["name"].to_list()
    parsed = {name: parse_frame(name) for name in set(names)}
    user = np.array([bool(p) and not is_library(p["file"]) for p in map(parsed.get, names)])
    fallback = np.array(
        [
            bool(p) and p["function"] == "forward" and p["file"].startswith(FALLBACK_PACKAGE)
            for p in map(parsed.get, names)
        ]
    )
    if not (user.any() or fallback.any()):
        return {}
    parent = _parents(frames)
    op_rows = trace.ops.filter(pl.col("event").is_in(wanted)).select("event", "tid", "ts_ns")
    tids = frames["tid"].to_numpy()
    starts = frames["ts_ns"].to_numpy()
    ends = frames["end_ns"].to_numpy()
    found: dict[int, dict[str, Any]] = {}
    for tid, rows in op_rows.group_by("tid"):
        lo = int(np.searchsorted(tids, tid[0], side="left"))
        hi = int(np.searchsorted(tids, tid[0], side="right"))
        if lo == hi:
            continue
        at = np.searchsorted(starts[lo:hi], rows["ts_ns"].to_numpy(), side="right") - 1 + lo
        for event, i, ts in zip(rows["event"].to_list(), at, rows["ts_ns"].to_list(), strict=True):
            frame = _innermost(int(i), int(ts), lo, starts, ends, parent, user, fallback)
            if frame is not None:
                found[int(event)] = dict(parsed[names[frame]])  # type: ignore[arg-type]
    return found


def _parents(frames: pl.DataFrame) -> np.ndarray:
    """Each frame's parent row (-1: none), by `python_parent_id` on its thread."""
    ids = frames.with_row_index("row").select("row", "tid", "python_id")
    linked = (
        frames.select("tid", "python_parent_id")
        .with_row_index("child")
        .join(
            ids.rename({"python_id": "python_parent_id", "row": "parent"}),
            on=["tid", "python_parent_id"],
            how="left",
        )
        .sort("child")
    )
    return linked["parent"].fill_null(-1).cast(pl.Int64).to_numpy()


def _innermost(
    i: int,
    ts: int,
    lo: int,
    starts: np.ndarray,
    ends: np.ndarray,
    parent: np.ndarray,
    user: np.ndarray,
    fallback: np.ndarray,
) -> int | None:
    """The innermost user frame open at `ts`, from row `i` (the last frame of the thread
    to start by then) up its parents; else the innermost fallback frame on the way."""
    first_fallback = None
    seen = 0
    while i >= lo and seen < 10_000:  # parent ids from a file: a loop must end
        seen += 1
        if starts[i] <= ts < ends[i]:
            if user[i]:
                return i
            if first_fallback is None and fallback[i]:
                first_fallback = i
        # frames nest: every frame open at `ts` is an ancestor of the last one to start
        nxt = int(parent[i])
        i = nxt if lo <= nxt < i else i - 1
    return first_fallback
