"""The trace dialects seen in the wild load into the same frames, metadata intact.

Each test names the dialect and checks what distinguishes it against the file itself read
with the stdlib: the 2021 Kineto schema, ROCm, CPU-only, MTIA, multi-rank metadata,
`baseTimeNanoseconds`, `deviceProperties` and top-level keys traceq does not model.

Sources and licenses (../shared/traces/INDEX.md): HolisticTraceAnalysis test data
(facebookresearch/HolisticTraceAnalysis, MIT); kineto tb_plugin samples (pytorch/kineto,
BSD-3); TraceLens test traces (AMD-AGI/TraceLens, MIT). Absent files skip.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import traceq

HTA = "hta/tests/data/"
OLD_SMALL = HTA + "trace_file_list/inference_rank_1.json.gz"
OLD_TB = (
    "kineto_tb_plugin/tb_plugin/samples/resnet50_num_workers_0/"
    "worker0.1623143089861.pt.trace.json.gz"
)
ROCM = HTA + "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
CPU_ONLY = HTA + "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
MTIA = HTA + "mtia_inference_trace/mtia_inference_rank_0.json.gz"
NCCL = HTA + "nccl_parser_config/nccl_data.json.gz"
QWEN = "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"

Loader = Callable[[str], traceq.Trace]
Reader = Callable[..., Any]


@pytest.fixture(scope="module")
def stdlib(shared_trace: Callable[[str], Path], read_json: Reader) -> Callable[[str], Any]:
    cache: dict[str, Any] = {}

    def read(relpath: str) -> Any:
        if relpath not in cache:
            cache[relpath] = read_json(shared_trace(relpath))
        return cache[relpath]

    return read


def x_count(raw: list[dict[str, Any]], cat: str) -> int:
    return sum(e.get("ph") == "X" and e.get("cat") == cat for e in raw)


@pytest.mark.slow
def test_2021_schema_maps_operator_kernel_runtime_memcpy(load_shared: Loader, stdlib) -> None:
    raw = stdlib(OLD_TB)["traceEvents"]
    trace = load_shared(OLD_TB)
    assert trace.schema == "kineto-2021"
    assert trace.ops.height == x_count(raw, "Operator") > 0
    assert trace.runtime.height == x_count(raw, "Runtime") > 0
    kinds = Counter(trace.kernels["kind"].to_list())
    assert kinds == {
        "kernel": x_count(raw, "Kernel"),
        "memcpy": x_count(raw, "Memcpy"),
        "memset": x_count(raw, "Memset"),
    }
    assert kinds["memcpy"] > 0


@pytest.mark.slow
def test_2021_schema_streams_are_read_from_stream_n_thread_names(
    load_shared: Loader, stdlib
) -> None:
    raw = stdlib(OLD_TB)["traceEvents"]
    gpu = [e for e in raw if e.get("ph") == "X" and e.get("cat") in ("Kernel", "Memcpy", "Memset")]
    assert {e["tid"] for e in gpu} == {"stream 7"}
    assert load_shared(OLD_TB).kernels["stream"].unique().to_list() == [7]


def test_2021_schema_async_flows_pair_launch_and_kernel(load_shared: Loader, stdlib) -> None:
    raw = stdlib(OLD_SMALL)["traceEvents"]
    ends = {(e["cat"], str(e["id"])): e["ph"] for e in raw if e.get("ph") in ("s", "f")}
    flows = load_shared(OLD_SMALL).flows
    assert flows["cat"].unique().to_list() == ["async_gpu"]
    assert flows.height == len({key for key in ends}) == 4
    assert flows["start_event"].null_count() == flows["end_event"].null_count() == 0
    # each flow runs from the launching runtime call to the kernel it launched
    kernels = load_shared(OLD_SMALL).kernels
    assert sorted(kernels["correlation"].cast(pl.String).to_list()) == sorted(
        flows["flow_id"].to_list()
    )


def test_rocm_hip_runtime_launches_are_linked(load_shared: Loader, stdlib) -> None:
    raw = stdlib(ROCM)["traceEvents"]
    hip = [e for e in raw if e.get("cat") == "cuda_runtime"]
    assert all(e["name"].startswith("hip") for e in hip)
    trace = load_shared(ROCM)
    assert set(trace.runtime["name"]) == {e["name"] for e in hip}
    gemms = trace.kernels.filter(pl.col("name").str.starts_with("Cijk_"))
    assert gemms.height > 0
    assert trace.kernels["runtime_event"].null_count() == 0
    launched = trace.runtime.filter(pl.col("event").is_in(trace.kernels["runtime_event"].to_list()))
    assert set(launched["name"]) >= {"hipLaunchKernel", "hipExtModuleLaunchKernel"}


def test_rocm_device_comes_from_the_event_and_is_named(load_shared: Loader, stdlib) -> None:
    raw = stdlib(ROCM)["traceEvents"]
    pids = {e["pid"] for e in raw if e.get("cat") in ("kernel", "gpu_memcpy")}
    trace = load_shared(ROCM)
    assert trace.kernels["device"].unique().to_list() == sorted(pids) == [2]
    assert trace.device_name(2) == stdlib(ROCM)["deviceProperties"][0]["name"]


def test_cpu_only_trace_has_ops_and_no_gpu_activity(load_shared: Loader, stdlib) -> None:
    raw = stdlib(CPU_ONLY)["traceEvents"]
    trace = load_shared(CPU_ONLY)
    assert trace.ops.height == x_count(raw, "cpu_op") > 0
    assert trace.annotations.height == x_count(raw, "user_annotation") > 0
    assert trace.kernels.height == trace.runtime.height == 0
    assert trace.gpu_busy().height == 0
    assert trace.device_properties == []


def test_mtia_device_work_and_runtime_are_modeled(load_shared: Loader, stdlib) -> None:
    doc = stdlib(MTIA)
    raw = doc["traceEvents"]
    trace = load_shared(MTIA)
    assert trace.kernels.height == x_count(raw, "mtia_ccp_events") > 0
    assert trace.runtime.height == x_count(raw, "mtia_runtime") > 0
    device = doc["deviceProperties"][0]
    assert trace.kernels["device"].unique().to_list() == [device["id"]]
    assert trace.device_name(device["id"]) == "ARTEMIS"
    linked = trace.kernels.filter(pl.col("runtime_event").is_not_null())
    assert linked.height > 0


@pytest.mark.parametrize(
    ("relpath", "rank", "world_size"),
    [(NCCL, 0, 2), (CPU_ONLY, 34, 300), (OLD_SMALL, 1, None)],
)
def test_rank_and_world_size_come_from_distributed_info(
    relpath: str, rank: int, world_size: int | None, load_shared: Loader, stdlib
) -> None:
    info = stdlib(relpath)["distributedInfo"]
    trace = load_shared(relpath)
    assert (trace.rank, trace.world_size) == (info.get("rank"), info.get("world_size"))
    assert (trace.rank, trace.world_size) == (rank, world_size)
    assert trace.distributed == info


@pytest.mark.parametrize("relpath", [ROCM, CPU_ONLY, MTIA, QWEN, NCCL, OLD_SMALL])
def test_top_level_metadata_is_kept_whole(relpath: str, load_shared: Loader, stdlib) -> None:
    doc = dict(stdlib(relpath))
    doc.pop("traceEvents")
    trace = load_shared(relpath)
    assert trace.metadata == doc
    assert trace.base_time_ns == doc.get("baseTimeNanoseconds")
    assert trace.device_properties == doc.get("deviceProperties", [])
    assert trace.schema_version == doc.get("schemaVersion")


def test_unknown_top_level_keys_stay_reachable(load_shared: Loader) -> None:
    trace = load_shared(MTIA)
    assert trace.metadata["host_name"].startswith("twshared")
    assert trace.metadata["ERROR"][0].startswith("ERROR:")
    assert trace.trace_id == "13072646111613355758"
    qwen = load_shared(QWEN)
    assert qwen.metadata["with_modules"] == 1
    assert {"cuda_runtime_version", "cupti_version", "cuda_driver_version"} <= set(qwen.versions)


def test_device_properties_name_each_device(load_shared: Loader, stdlib) -> None:
    props = stdlib(QWEN)["deviceProperties"]
    trace = load_shared(QWEN)
    assert props and all(trace.device_name(p["id"]) == p["name"] for p in props)
    assert "H100" in trace.device_name(0)
