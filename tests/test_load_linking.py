"""Links between frames, each checked against an independent stdlib computation.

- Launch: a GPU activity is linked to the runtime call with its `correlation`.
- Op: the innermost CPU op on the launching thread that encloses the runtime call (found
  here by a sequential stack sweep, not traceq's vectorised pointer jumping); failing that,
  the first op with the activity's `External id`.
- Step: an op belongs to the `ProfilerStep#N` window that holds its start; a kernel to the
  step of its launch (of its own start when it has no launch).
- Module: an op carries the dotted path of the innermost `nn.Module` call around it.

Runs on the project's fixtures and every Kineto trace in ../shared/traces (skipped when
absent); sources and licenses of those are listed in test_load_accounting's docstring.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from conftest import TraceCase

OP_CATS = {"cpu_op", "operator"}
GPU_CATS = {"kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "mtia_ccp_events"}
RUNTIME_CATS = {"cuda_runtime", "runtime", "cuda_driver", "mtia_runtime"}
STEP = re.compile(r"^ProfilerStep#(\d+)$")
MODULE = "nn.Module: "

Span = tuple[int, int, int]  # (event index, ts_ns, end_ns)


def number(value: Any) -> int | None:
    if value is None:
        return None
    match = re.search(r"-?\d+$", str(value).strip())
    return int(match.group()) if match else None


def ns(value: Any) -> int:
    return int(value * 1000)


def complete(raw: list[dict[str, Any]], cats: set[str]) -> list[int]:
    return [
        i
        for i, e in enumerate(raw)
        if e.get("ph") == "X" and str(e.get("cat") or "").lower() in cats
    ]


def span(raw: list[dict[str, Any]], i: int) -> Span:
    ts = ns(raw[i]["ts"])
    return i, ts, ts + ns(raw[i].get("dur", 0))


def thread(raw: list[dict[str, Any]], i: int) -> tuple[int | None, int | None]:
    return number(raw[i].get("pid")), number(raw[i].get("tid"))


def innermost_enclosing(inner: list[Span], outer: list[Span]) -> dict[int, int]:
    """For spans on one thread: event of the innermost `outer` span around each `inner`.

    A sweep in start order keeps a stack of open outer spans; an inner span takes the
    topmost one that still reaches its end.
    """
    items = [(ts, 0, -end, i, end) for i, ts, end in outer]
    items += [(ts, 1, -end, i, end) for i, ts, end in inner]
    stack: list[tuple[int, int]] = []  # (end, event)
    found: dict[int, int] = {}
    for ts, kind, _, i, end in sorted(items):
        while stack and stack[-1][0] < ts:
            stack.pop()
        if kind == 0:
            stack.append((end, i))
            continue
        for outer_end, outer_event in reversed(stack):
            if outer_end >= end:
                found[i] = outer_event
                break
    return found


def by_thread(raw: list[dict[str, Any]], events: list[int]) -> dict[Any, list[Span]]:
    groups: dict[Any, list[Span]] = defaultdict(list)
    for i in events:
        groups[thread(raw, i)].append(span(raw, i))
    return groups


def enclosing_on_thread(raw: list[dict[str, Any]], inner: list[int], outer: list[int]):
    inner_groups, outer_groups = by_thread(raw, inner), by_thread(raw, outer)
    found: dict[int, int] = {}
    for key, spans in inner_groups.items():
        found |= innermost_enclosing(spans, outer_groups.get(key, []))
    return found


def column(frame: pl.DataFrame, name: str) -> dict[int, Any]:
    return dict(zip(frame["event"].to_list(), frame[name].to_list(), strict=True))


def expected_launches(raw: list[dict[str, Any]]) -> dict[int, int | None]:
    first_runtime: dict[int, int] = {}
    for i in complete(raw, RUNTIME_CATS):
        corr = number((raw[i].get("args") or {}).get("correlation"))
        if corr is not None:
            first_runtime.setdefault(corr, i)
    return {
        i: first_runtime.get(number((raw[i].get("args") or {}).get("correlation")))
        for i in complete(raw, GPU_CATS)
    }


def external_id(event: dict[str, Any]) -> int | None:
    args = event.get("args") or {}
    return number(args.get("External id", args.get("external id")))


def test_kernels_link_to_the_runtime_call_with_their_correlation(kineto_case: TraceCase) -> None:
    expected = expected_launches(kineto_case.raw_events)
    assert column(kineto_case.trace.kernels, "runtime_event") == expected


def test_kernel_op_is_the_innermost_op_around_its_launch(kineto_case: TraceCase) -> None:
    raw = kineto_case.raw_events
    ops = complete(raw, OP_CATS)
    runtime_op = enclosing_on_thread(raw, complete(raw, RUNTIME_CATS), ops)
    first_op_by_external: dict[int, int] = {}
    for i in ops:
        ext = external_id(raw[i])
        if ext is not None:
            first_op_by_external.setdefault(ext, i)
    expected = {
        k: runtime_op[r] if r in runtime_op else first_op_by_external.get(external_id(raw[k]))
        for k, r in expected_launches(raw).items()
    }
    trace = kineto_case.trace
    assert column(trace.kernels, "op_event") == expected
    assert column(trace.runtime, "op_event") == {
        i: runtime_op.get(i) for i in complete(raw, RUNTIME_CATS)
    }
    unlinked = sum(op is None for op in expected.values())
    assert trace.unlinked.get("kernels_without_op", 0) == unlinked


def step_windows(raw: list[dict[str, Any]]) -> tuple[list[int], list[int], list[int]]:
    first: dict[int, Span] = {}
    for i, e in enumerate(raw):
        match = STEP.match(str(e.get("name")))
        if e.get("ph") == "X" and e.get("cat") != "gpu_user_annotation" and match:
            first.setdefault(int(match.group(1)), span(raw, i))
    windows = sorted((ts, end, step) for step, (_, ts, end) in first.items())
    return [w[0] for w in windows], [w[1] for w in windows], [w[2] for w in windows]


def step_at(windows: tuple[list[int], list[int], list[int]], ts: int) -> int | None:
    starts, ends, steps = windows
    at = bisect.bisect_right(starts, ts) - 1
    return steps[at] if at >= 0 and ts < ends[at] else None


def test_ops_carry_the_step_whose_window_holds_their_start(kineto_case: TraceCase) -> None:
    raw = kineto_case.raw_events
    windows = step_windows(raw)
    expected = {i: step_at(windows, ns(raw[i]["ts"])) for i in complete(raw, OP_CATS)}
    assert column(kineto_case.trace.ops, "step") == expected


def test_kernels_carry_the_step_of_their_launch(kineto_case: TraceCase) -> None:
    raw = kineto_case.raw_events
    windows = step_windows(raw)
    expected = {}
    for k, r in expected_launches(raw).items():
        launched = step_at(windows, ns(raw[r]["ts"])) if r is not None else None
        expected[k] = launched if launched is not None else step_at(windows, ns(raw[k]["ts"]))
    assert column(kineto_case.trace.kernels, "step") == expected


def test_ops_carry_the_path_of_the_innermost_module_around_them(kineto_case: TraceCase) -> None:
    raw = kineto_case.raw_events
    modules = [
        i for i in complete(raw, {"python_function"}) if str(raw[i].get("name")).startswith(MODULE)
    ]
    parent = module_parents(raw, modules)
    path: dict[int, str] = {}
    for i in sorted(modules, key=lambda m: depth_of(m, parent)):
        name = str(raw[i]["name"]).removeprefix(MODULE)
        path[i] = f"{path[parent[i]]}.{name}" if i in parent else name
    ops = complete(raw, OP_CATS)
    around = enclosing_on_thread(raw, ops, modules)
    expected = {op: path[around[op]] if op in around else None for op in ops}
    assert column(kineto_case.trace.ops, "module") == expected
    if modules and ops:
        assert any(expected.values())


def module_parents(raw: list[dict[str, Any]], modules: list[int]) -> dict[int, int]:
    """Each module call's innermost enclosing *other* module call on its thread."""
    result: dict[int, int] = {}
    for spans in by_thread(raw, modules).values():
        stack: list[Span] = []
        for event, ts, end in sorted(spans, key=lambda s: (s[1], -s[2], s[0])):
            while stack and stack[-1][2] < end:
                stack.pop()
            if stack:
                result[event] = stack[-1][0]
            stack.append((event, ts, end))
    return result


def depth_of(i: int, parent: dict[int, int]) -> int:
    depth = 0
    while i in parent:
        i, depth = parent[i], depth + 1
    return depth
