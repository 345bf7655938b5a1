"""Files built to cost: each is small, claims or nests something huge, and must still be
read in bounded memory and time, or fail with one `traceq: error: ...` line and exit 2
(exit 1 means "regression" to CI, and a traceback means a bug).

Limits stated here and tested below:
- nesting depth: op trees of any depth cost memory linear in the number of ops; 6,000 ops
  nested in one chain run `baseline save`, `check` and `diff` under a 2 GiB address-space
  limit (the ancestor-pair table they built before needed 3.5 GB for 8,000);
- rank counts: a job never enumerates more than `MISSING_LISTED` ranks from a stated
  `world_size` (it counts the rest), and a rank that does not fit 64 bits is left out;
- name lengths: an op name of 1 MiB is carried, not matched character by character;
- recorded sizes: a dimension past `shapes.MAX_DIM` (2**48) or a shape of more than
  `shapes.MAX_NUMEL` (2**62) elements is no shape (unknown, as a missing one): the loader
  reads integers up to 3.4e38, and ten dimensions of 1e37 once ended every fusion rule and
  the roofline in an `OverflowError` traceback.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from traceq.cli.main import main

import traceq
from traceq.job.job import MISSING_LISTED

FIXTURES = Path(__file__).parents[1] / "fixtures"
SLOW_JOB = FIXTURES / "jobs" / "ddp_gloo_slow2"
ROOT = Path(__file__).parents[1]


def op(name: str = "aten::mm", ts: float = 10, dur: float = 5, **fields: Any) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "cpu_op",
        "name": name,
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": dur,
        **fields,
    }


def write(path: Path, events: list[Any], **top: Any) -> Path:
    path.write_text(json.dumps({"schemaVersion": 1, **top, "traceEvents": events}))
    return path


def deep_chain(depth: int) -> list[dict[str, Any]]:
    """`depth` ops nested in one chain inside a step, the innermost launching 50 kernels."""
    events = [op("ProfilerStep#1", 0, 4 * depth + 100, cat="user_annotation")]
    events += [
        op(f"op{i % 3}", 1 + i, 4 * depth - 2 * i, args={"External id": i + 1})
        for i in range(depth)
    ]
    for k in range(50):
        ids = {"correlation": k + 1, "External id": depth}
        events.append(op("cudaLaunchKernel", depth + 1.5, 0.1, cat="cuda_runtime", args=ids))
        kernel = {**ids, "device": 0, "stream": 7}
        events.append(op("k", 5 * depth + k, 1, cat="kernel", pid=0, tid=7, args=kernel))
    return events


def bounded(script: str, memory_mib: int = 2048, seconds: int = 240) -> str:
    """Run `script` in a fresh interpreter under an address-space limit; its stdout."""
    prelude = (
        "import resource\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({memory_mib << 20}, {memory_mib << 20}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=seconds,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TRACEQ_CACHE": "0"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def one_error_line(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("traceq: error: "), result.output
    return lines[0]


# -- item 2: deep op nesting ---------------------------------------------------------------


def test_deeply_nested_ops_run_regression_commands_in_bounded_memory(tmp_path: Path) -> None:
    trace = write(tmp_path / "deep.json", deep_chain(6000))
    out = bounded(
        f"""
        from click.testing import CliRunner
        from traceq.cli.main import main
        base, trace = {str(tmp_path / "base.json")!r}, {str(trace)!r}
        for args in (["baseline", "save", trace, "-o", base], ["check", trace, "--baseline", base],
                     ["diff", trace, trace]):
            result = CliRunner().invoke(main, args)
            print(args[0], result.exit_code)
        """
    )
    assert out.split() == ["baseline", "0", "check", "0", "diff", "0"]


def test_op_totals_of_a_deep_chain_count_each_name_once_per_kernel(tmp_path: Path) -> None:
    """Every kernel runs under all three names; each name's outermost op is its instance."""
    from traceq.regression.groups import op_totals

    totals = op_totals(traceq.load(write(tmp_path / "deep.json", deep_chain(3000)), cache=False))
    assert totals.select("group", "step", "count", "time_ns").rows() == [
        (f"op{i}", 1, 1, 50_000) for i in range(3)
    ]


# -- item 3: a job's world size ---------------------------------------------------------------


def _ranks(folder: Path, *infos: dict[str, Any]) -> Path:
    folder.mkdir()
    for i, info in enumerate(infos):
        write(folder / f"r{i}.json", [op()], distributedInfo=info)
    return folder


def test_a_world_size_of_2_to_the_40_is_counted_not_enumerated(tmp_path: Path) -> None:
    job = _ranks(
        tmp_path / "job", {"rank": 0, "world_size": 2**40}, {"rank": 1, "world_size": 2**40}
    )
    out = bounded(
        f"""
        import traceq
        job = traceq.load_job({str(job)!r}, engine="serial")
        print(job.missing_count)
        print(len(job.missing_ranks))
        print(job.missing_ranks[:3])
        print(job.process_groups.row(0, named=True)["ranks"])
        print(job.notes()[0])
        """,
        memory_mib=1024,
        seconds=60,
    )
    count, listed, first, groups, note = out.strip().splitlines()
    assert int(count) == 2**40 - 2 and int(listed) == MISSING_LISTED
    assert first == "[2, 3, 4]" and groups == "[0, 1]"
    assert note == "1099511627774 of 1099511627776 ranks have no trace: 2, 3, 4, 5, 6, 7, 8, 9 ..."


def test_a_rank_beyond_64_bits_is_left_out_with_a_note(tmp_path: Path) -> None:
    job = traceq.load_job(
        _ranks(
            tmp_path / "job", {"rank": 0, "world_size": 2}, {"rank": 2**70, "world_size": 2**80}
        ),
        engine="serial",
    )
    assert job.ranks == [0] and job.world_size == 2
    assert job.frames.ranks["rank"].to_list() == [0]
    assert any("does not fit 64 bits; the file is left out" in n for n in job.notes())


# -- item 6: one line and exit 2, never a traceback ----------------------------------------------


@pytest.mark.parametrize("number", ["99999999999999999999", "٣", "3٣"])
def test_a_step_number_that_is_not_an_int64_marks_no_step(tmp_path: Path, number: str) -> None:
    step = op(f"ProfilerStep#{number}", 0, 100, cat="user_annotation")
    path = write(tmp_path / "t.json", [step, op()])
    trace = traceq.load(path, cache=False)
    assert trace.steps.height == 0
    assert f"ProfilerStep#{number}" in trace.annotations["name"].to_list()
    assert CliRunner().invoke(main, ["info", str(path), "--no-cache"]).exit_code == 0


def test_a_step_number_that_is_not_an_int64_marks_no_step_in_a_job(tmp_path: Path) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    for rank, number in enumerate(["99999999999999999999", "٣"]):
        step = op(f"ProfilerStep#{number}", 0, 100, cat="user_annotation")
        write(
            folder / f"r{rank}.json", [step, op()], distributedInfo={"rank": rank, "world_size": 2}
        )
    job = traceq.load_job(folder, engine="serial", cache=False)
    assert sorted(job.frames.ranks["rank"].to_list()) == [0, 1] and not job.failed
    assert job.frames.step_ns.height == 0


KERNEL_TRACE = [
    op("ProfilerStep#1", 0, 100, cat="user_annotation"),
    op("aten::mm", 10, 50, args={"External id": 1}),
    op("cudaLaunchKernel", 20, 5, cat="cuda_runtime", args={"correlation": 1, "External id": 1}),
    op(
        "sgemm",
        30,
        20,
        cat="kernel",
        pid=0,
        tid=7,
        args={"correlation": 1, "External id": 1, "device": 0, "stream": 7},
    ),
]


@pytest.mark.parametrize("props", [[1], [[1]], {"a": 1}, "x", [{"id": 0, "name": 5}]])
@pytest.mark.parametrize("command", [["info"], ["analyze"], ["baseline", "save", "-o", "b.json"]])
def test_device_properties_of_another_shape_are_ignored(
    tmp_path: Path, props: Any, command: list[str]
) -> None:
    path = write(tmp_path / "t.json", KERNEL_TRACE, deviceProperties=props)
    args = [a.replace("b.json", str(tmp_path / "b.json")) for a in command]
    result = CliRunner().invoke(main, [*args, str(path), "--no-cache"])
    assert result.exit_code == 0, result.output


def test_annotate_reads_a_trace_that_starts_with_a_bom(tmp_path: Path) -> None:
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"traceEvents": KERNEL_TRACE}).encode())
    out = tmp_path / "out.json"
    result = CliRunner().invoke(main, ["annotate", str(path), "-o", str(out), "--no-cache"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(out.read_bytes())["traceEvents"]) >= len(KERNEL_TRACE)


# -- item 7: two `traceEvents` keys; a truncated gzip rank ------------------------------------


def _duplicated(events_first: int) -> bytes:
    """A trace object with two `traceEvents` keys: `events_first` ops, then 3 others."""
    first = ",".join(json.dumps(op(f"first{i}", ts=i)) for i in range(events_first))
    second = ",".join(json.dumps(op(f"second{i}", ts=i)) for i in range(3))
    return (
        f'{{"schemaVersion":1,"traceEvents":[{first}],"x":1,"traceEvents":[{second}]}}'
    ).encode()


@pytest.mark.parametrize("events_first", [2, 60_000])  # one piece; cut into pieces (> 1 MiB)
def test_the_last_trace_events_key_wins_at_every_size(tmp_path: Path, events_first: int) -> None:
    """As `json.load` reads such a document: the second array is the trace."""
    data = _duplicated(events_first)
    path = tmp_path / "dup.json"
    path.write_bytes(data)
    expected = [e["name"] for e in json.loads(data)["traceEvents"]]
    assert traceq.load(path, cache=False).events["name"].to_list() == expected
    gz = tmp_path / "dup.json.gz"
    gz.write_bytes(gzip.compress(data))
    assert traceq.load(gz, cache=False).events["name"].to_list() == expected


@pytest.mark.parametrize("keep", [0.5, 0.01])
def test_a_truncated_gzip_rank_is_called_truncated(tmp_path: Path, keep: float) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    data = (SLOW_JOB / "rank-1.pt.trace.json.gz").read_bytes()
    (folder / "rank-0.pt.trace.json.gz").write_bytes(
        (SLOW_JOB / "rank-0.pt.trace.json.gz").read_bytes()
    )
    (folder / "rank-1.pt.trace.json.gz").write_bytes(data[: max(int(len(data) * keep), 12)])
    job = traceq.load_job(folder, engine="serial", cache=False)
    _ = job.frames
    (note,) = [n for n in job.notes() if n.startswith("rank 1: ")]
    assert "truncated gzip stream" in note and "empty file" not in note


# -- name lengths ---------------------------------------------------------------------------------


def test_a_one_mebibyte_op_name_is_carried_in_bounded_time(tmp_path: Path) -> None:
    name = "aten::" + "x" * (1 << 20)
    path = write(
        tmp_path / "long.json",
        [
            op("ProfilerStep#1", 0, 100, cat="user_annotation"),
            *[op(name, ts=10 + 10 * i, dur=5) for i in range(8)],
        ],
    )
    out = bounded(
        f"""
        import time
        from click.testing import CliRunner
        from traceq.cli.main import main
        start = time.monotonic()
        base, trace = {str(tmp_path / "base.json")!r}, {str(path)!r}
        for args in (["baseline", "save", trace, "-o", base], ["check", trace, "--baseline", base]):
            print(args[0], CliRunner().invoke(main, args).exit_code)
        print(time.monotonic() - start < 60)
        """
    )
    assert out.split() == ["baseline", "0", "check", "0", "True"]


HUGE = 10**37  # within what the loader reads (3.4e38), far past int64


@pytest.mark.parametrize(
    "dims",
    [[[HUGE, HUGE], [HUGE, HUGE]], [[HUGE] * 10, [HUGE] * 10], [[2**40] * 2, [2**40] * 2]],
    ids=["dims-past-int64", "numel-past-any-float", "numel-past-int64"],
)
def test_sizes_no_tensor_can_have_are_no_shape(tmp_path: Path, dims: list[list[int]]) -> None:
    from traceq.perf.cost import op_cost
    from traceq.relations.dataflow.shapes import is_shape

    types = ["float", "float"]
    events = [
        op(name, ts=10 + 60 * i, dur=50, args={"Input Dims": dims, "Input type": types,
                                                "External id": i + 1})
        for i, name in enumerate(["aten::mm", "aten::add", "vllm::rms_norm", "aten::mul"])
    ]  # fmt: skip
    path = write(tmp_path / "sizes.json", events)
    for command in (["analyze"], ["roofline"], ["info"], ["critical-path"], ["report", "-o",
                    str(tmp_path / "r.html")]):  # fmt: skip
        result = CliRunner().invoke(main, [*command, str(path), "--no-cache"])
        assert result.exit_code in (0, 1), (command, result.output[-2000:])
        assert result.exception is None or isinstance(result.exception, SystemExit), command
    assert not any(is_shape(d) for d in dims)
    assert not op_cost("aten::mm", dims, types, ["", ""]).modelled
    outputs = traceq.load(path).dataflow_ops["output_shape"].drop_nulls().to_list()
    assert all(is_shape(s) for s in outputs)  # none made from the sizes that are no shape
