"""The device spec table: every figure sourced, parts identified from what traces record,
calibrated spec files read back (and taken by the device model through configuration)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traceq.errors import ConfigError
from traceq.perf import specs
from traceq.perf.device import GPU_TABLE, gpu_model
from traceq.perf.specs import DTYPES, identify, load_spec, spec_named

H100_PROPS = {
    "name": "NVIDIA H100 80GB HBM3",
    "numSms": 132,
    "totalGlobalMem": 85018279936,
    "computeMajor": 9,
    "computeMinor": 0,
}


def test_every_spec_names_its_source_and_only_known_dtypes() -> None:
    for spec in specs.SPECS:
        assert spec.source, spec.name
        assert set(spec.peak_tflops) <= set(DTYPES), spec.name
        assert all(v is None or v > 0 for v in spec.peak_tflops.values()), spec.name
        assert spec.hbm_gbs > 0


@pytest.mark.parametrize("name", ["RTX 2080 Ti", "T4", "V100 SXM2", "V100 PCIe"])
def test_turing_and_volta_have_no_bf16_tf32_or_fp8_unit(name: str) -> None:
    spec = spec_named(name)
    for dtype in ("bf16", "tf32", "fp8"):
        assert not spec.has_unit(dtype) and spec.peak(dtype) is None
    assert spec.has_unit("fp16")


def test_the_parts_the_issue_lists_are_all_in_the_table() -> None:
    wanted = [
        "A100 40GB",
        "A100 80GB",
        "H100 SXM",
        "H100 PCIe",
        "H100 NVL",
        "H200",
        "H800",
        "GH200",
        "B200",
        "GB200",
        "L4",
        "L40S",
        "RTX 4090",
        "RTX 3090",
        "RTX 2080 Ti",
        "V100 SXM2",
        "T4",
        "A10",
        "A10G",
        "MI210",
        "MI250X (one GCD)",
        "MI300X",
        "MI325X",
        "MI355X",
    ]
    for name in wanted:
        assert spec_named(name)


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        (H100_PROPS, "H100 SXM"),
        ({"name": "NVIDIA H100 PCIe", "totalGlobalMem": 85e9}, "H100 PCIe"),
        ({"name": "NVIDIA A100-PG509-200", "totalGlobalMem": 42297524224}, "A100 40GB"),
        ({"name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 84990623744}, "A100 80GB"),
        ({"name": "NVIDIA GH200 480GB", "totalGlobalMem": 102e9}, "GH200"),
        ({"name": "Tesla V100-SXM2-32GB"}, "V100 SXM2"),
        ({"name": "NVIDIA GeForce RTX 2080 Ti"}, "RTX 2080 Ti"),
        ({"name": "AMD Instinct MI300X", "numSms": 304}, "MI300X"),
        # ROCm traces without a name: architecture (gfx942 = 9.4) and CU count decide
        (
            {
                "name": "",
                "numSms": 304,
                "computeMajor": 9,
                "computeMinor": 4,
                "totalGlobalMem": 206141652992,
            },
            "MI300X",
        ),
        (
            {
                "name": "AMD Radeon Graphics",
                "numSms": 104,
                "computeMajor": 9,
                "computeMinor": 0,
                "warpSize": 64,
            },
            "MI250 (one GCD)",
        ),
    ],
)
def test_identify_from_device_properties(props: dict, expected: str) -> None:
    spec = identify(props)
    assert spec is not None and spec.name == expected


def test_a_part_nothing_identifies_gets_no_spec_rather_than_a_guess() -> None:
    assert identify({"name": "Mystery Accelerator 9000"}) is None
    assert identify({}) is None


def test_kernel_names_give_the_architecture_when_the_name_does_not() -> None:
    names = ["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "void foo()"]
    assert specs.arch_of_kernels(names) == "hopper"
    assert identify({"numSms": 114}, names).name == "H100 PCIe"  # the one Hopper with 114
    assert identify({"numSms": 132}, names) is None  # H100 SXM, H200, H800...: no guess


# Figures that differ from traceq's earlier GPU_TABLE, each for a stated reason: the
# device model keeps its table (no finding changes), the roofline uses this one.
DIFFERENT_FROM_GPU_TABLE = {
    ("L40S", "half"): "datasheet prints 362.05 dense (733 sparse); GPU_TABLE rounded to 366",
    ("B200", "tf32"): "HGX B200 prints 18 PF sparse per 8 GPUs: 1125 dense, not 1100",
    ("MI250X (one GCD)", "fp32"): "GPU_TABLE's 23.9 is the vector rate; the matrix rate is 47.85",
}


def test_figures_differing_from_the_device_model_table_are_the_listed_ones() -> None:
    by_key = {"fp32": "fp32", "tf32": "tf32", "half": "fp16"}
    differ = set()
    for pattern, min_mem, figures in GPU_TABLE:
        name = {
            r"H100.*PCIe": "H100 PCIe",
            r"H100": "H100 SXM",
            r"A100": "A100 80GB" if min_mem else "A100 40GB",
            r"V100.*PCIe": "V100 PCIe",
            r"V100": "V100 SXM2",
            r"A10\b": "A10",
            r"L4\b": "L4",
            r"T4\b": "T4",
            r"MI250X?": "MI250X (one GCD)",
        }.get(pattern, pattern)
        try:
            spec = spec_named(name)
        except KeyError:
            continue  # A800, RTX 3060 Ti: not in the issue's list
        assert spec.hbm_gbs == pytest.approx(figures["bw"], rel=0.002) or name == "MI250X (one GCD)"
        for key, dtype in by_key.items():
            ours = spec.peak(dtype) or 0
            if abs(ours - figures[key]) > 0.51:
                differ.add((name, key))
    assert differ == set(DIFFERENT_FROM_GPU_TABLE)


def test_a_calibrated_json_spec_is_read_back(tmp_path: Path) -> None:
    path = tmp_path / "h100.json"
    path.write_text(
        json.dumps(
            {
                "name": "NVIDIA H100 80GB HBM3",
                "kind": "achievable",
                "peak_tflops": {"bf16": 700.5, "fp32": 50, "fp8": None},
                "hbm_gbs": 3000,
            }
        )
    )
    spec = load_spec(path)
    assert spec.kind == "achievable"
    assert spec.peak("bf16") == 700.5 and spec.peak("fp8") is None and spec.hbm_gbs == 3000


def test_a_toml_spec_is_read_too(tmp_path: Path) -> None:
    path = tmp_path / "part.toml"
    path.write_text('name = "lab part"\nhbm_gbs = 1000\n[peak_tflops]\nbf16 = 100.0\n')
    assert load_spec(path).peak("bf16") == 100.0


def test_a_spec_file_with_an_unknown_dtype_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"peak_tflops": {"fp7": 1}, "hbm_gbs": 1}))
    with pytest.raises(ConfigError, match="fp7"):
        load_spec(path)


def test_the_device_model_takes_a_spec_file_from_configuration(tmp_path: Path) -> None:
    """`[tool.traceq.device] spec_file = ...`: the calibrated figures replace the table's."""
    path = tmp_path / "cal.json"
    path.write_text(
        json.dumps(
            {
                "name": "x",
                "peak_tflops": {"bf16": 640.0, "fp16": 650.0, "fp32": 51.0},
                "hbm_gbs": 2900.0,
            }
        )
    )
    model = gpu_model(H100_PROPS).with_overrides({"spec_file": str(path)})
    assert model.memory_bandwidth_gbs == 2900.0
    assert model.half_tflops == 650.0 and model.fp32_tflops == 51.0
    assert "configured" in model.source
    # a figure set by name beside the file wins over the file's
    model = gpu_model(H100_PROPS).with_overrides(
        {"spec_file": str(path), "memory_bandwidth_gbs": 2500}
    )
    assert model.memory_bandwidth_gbs == 2500
