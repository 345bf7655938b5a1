"""Check and time the whole kernel zoo on a GPU at the post's MLP shapes; one table + JSON.

Shapes: a Linear+GELU MLP of 8192 rows, dim 768, hidden 3072, and the GLU MLP of the same
sizes, in bf16. Every entry goes through ``traceq.zoo.check`` (numerics against float64 on every
case, then ``do_bench`` medians beside the eager split reference and ``torch.compile``),
and three targets are measured:

- fused GEMM+GELU within 5% of the plain GEMM's time (cuBLAS ``x @ W.T``, same shape);
- ``glu`` at >= 85% of the copy bandwidth measured on this card (``dst.copy_(src)``);
- ``dual_gemm_glu`` faster than the best split: gate GEMM + up GEMM + the fastest fused
  GLU (Triton or Liger), Inductor's compiled split, or the eager split.

Run from the repository root on a machine with CUDA:
``python benchmarks/zoo_gpu.py [--out zoo_gpu.json] [--no-compile]``.
Exits 2 with a message when there is no GPU; 1 when an entry fails numerics.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# traceq.zoo lives in zoo/ but imports as traceq.zoo only once installed (pip install -e .).

ROWS, DIM, HIDDEN = 8192, 768, 3072
DTYPE = "bfloat16"

#: (pattern, act): the checks this script runs, all at (ROWS, DIM, HIDDEN).
CHECKS: tuple[tuple[str, str], ...] = (
    ("gemm_bias_act", "gelu_tanh"),  # the cuBLASLt epilogue takes part (tanh GELU on CUDA)
    ("gemm_bias_act", "gelu"),
    ("glu", "silu"),
    ("glu", "gelu_tanh"),
    ("dual_gemm_glu", "silu"),
    ("mlp", "gelu"),
)

GEMM_EPILOGUE_TARGET = 1.05  # fused time / plain GEMM time
GLU_BANDWIDTH_TARGET = 0.85  # glu GB/s / copy GB/s


@dataclass
class Target:
    name: str
    measured: float | None
    goal: str
    met: bool | None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "measured": self.measured,
            "goal": self.goal,
            "met": self.met,
            "detail": self.detail,
        }


def _no_gpu(message: str) -> int:
    print(f"zoo_gpu: {message}", file=sys.stderr)
    return 2


def _ms(fn: Callable[[], object]) -> float:
    from traceq.zoo.timing import median_ms

    return median_ms(fn, "cuda")[0]


def _main_ms(report: Any, entry: str, case: str = "main") -> float | None:
    try:
        result = report.entry(entry)
    except KeyError:
        return None
    for c in result.cases:
        if c.case == case and c.timing is not None:
            return c.timing.median_ms
    return None


def gemm_epilogue_target(reports: dict[tuple[str, str], Any]) -> Target:
    """Triton GEMM+bias+GELU against cuBLAS's plain GEMM at the same shape."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(ROWS, DIM, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(HIDDEN, DIM, device="cuda", generator=g) * DIM**-0.5).to(torch.bfloat16)
    plain_ms = _ms(lambda: x @ w.t())
    fused_ms = _main_ms(reports[("gemm_bias_act", "gelu")], "gemm_bias_act.triton")
    lt_ms = _main_ms(reports[("gemm_bias_act", "gelu_tanh")], "gemm_bias_act.addmm_activation")
    ratio = fused_ms / plain_ms if fused_ms else None
    return Target(
        "fused GEMM+GELU vs plain GEMM",
        ratio,
        f"<= {GEMM_EPILOGUE_TARGET:.2f}× the plain cuBLAS GEMM",
        None if ratio is None else ratio <= GEMM_EPILOGUE_TARGET,
        {"plain_gemm_ms": plain_ms, "triton_fused_ms": fused_ms, "cublaslt_epilogue_ms": lt_ms},
    )


def glu_bandwidth_target(reports: dict[tuple[str, str], Any]) -> Target:
    """The Triton GLU's achieved GB/s against a measured device-to-device copy."""
    import torch

    src = torch.randn(ROWS, 2 * HIDDEN, device="cuda").to(torch.bfloat16)
    dst = torch.empty_like(src)
    copy_ms = _ms(lambda: dst.copy_(src))
    copy_gbps = 2 * src.numel() * src.element_size() / (copy_ms / 1e3) / 1e9
    result = reports[("glu", "silu")].entry("glu.triton")
    timed = [c for c in result.cases if c.case == "main" and c.timing is not None]
    glu_gbps = timed[0].timing.gbps if timed else None
    fraction = glu_gbps / copy_gbps if glu_gbps else None
    return Target(
        "glu bandwidth vs copy",
        fraction,
        f">= {GLU_BANDWIDTH_TARGET:.0%} of the measured copy bandwidth",
        None if fraction is None else fraction >= GLU_BANDWIDTH_TARGET,
        {"copy_gbps": copy_gbps, "glu_gbps": glu_gbps, "copy_ms": copy_ms},
    )


def dual_gemm_target(reports: dict[tuple[str, str], Any]) -> Target:
    """dual_gemm_glu against the best split: two GEMMs plus the fastest fused GLU."""
    import torch
    from traceq.zoo.glu.liger import requires_liger
    from traceq.zoo.glu.triton import glu_triton

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(ROWS, DIM, device="cuda", generator=g).to(torch.bfloat16)
    w_gate = (torch.randn(HIDDEN, DIM, device="cuda", generator=g) * DIM**-0.5).to(torch.bfloat16)
    w_up = (torch.randn(HIDDEN, DIM, device="cuda", generator=g) * DIM**-0.5).to(torch.bfloat16)
    splits: dict[str, float] = {
        "mm + mm + triton glu": _ms(lambda: glu_triton(x @ w_gate.t(), x @ w_up.t(), "silu"))
    }
    if requires_liger("cuda") is None:
        from traceq.zoo.glu.liger import glu_liger

        splits["mm + mm + liger swiglu"] = _ms(
            lambda: glu_liger(x @ w_gate.t(), x @ w_up.t(), "silu")
        )
    report = reports[("dual_gemm_glu", "silu")]
    for entry, label in (
        ("dual_gemm_glu.reference", "eager split"),
        ("dual_gemm_glu.compile", "torch.compile split"),
    ):
        ms = _main_ms(report, entry)
        if ms is not None:
            splits[label] = ms
    best_label = min(splits, key=lambda k: splits[k])
    dual_ms = _main_ms(report, "dual_gemm_glu.triton")
    ratio = splits[best_label] / dual_ms if dual_ms else None
    return Target(
        "dual_gemm_glu vs best split",
        ratio,
        "> 1.00× (faster than the best split)",
        None if ratio is None else ratio > 1.0,
        {"dual_gemm_glu_ms": dual_ms, "splits_ms": splits, "best_split": best_label},
    )


def _row_speedup(report: Any, entry: str, case: str, ms: float) -> float | None:
    compiled = _main_ms(report, f"{report.pattern}.compile", case)
    return compiled / ms if compiled else None


def render(device_name: str, reports: dict[tuple[str, str], Any], targets: list[Target]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 180)
    table = Table(
        title=f"traceq zoo on {device_name}: {DTYPE}, rows={ROWS} dim={DIM} hidden={HIDDEN}"
    )
    for column in (
        "pattern", "act", "case", "entry", "status", "max rel err", "ms", "TFLOP/s", "GB/s",
        "% peak", "vs eager", "vs compile",
    ):  # fmt: skip
        table.add_column(column, overflow="fold")
    for (pattern, act), report in reports.items():
        for result in report.entries:
            error = result.max_rel_error
            error_text = "—" if error is None else f"{error:.2e}"
            timed = result.timed_cases or [None]
            for case in timed:
                if case is None or case.timing is None:
                    table.add_row(pattern, act, "—", result.entry, result.status, error_text,
                                  *["—"] * 6)  # fmt: skip
                    continue
                t = case.timing
                fraction = t.peak_tflops_fraction if t.tflops is not None else t.peak_gbps_fraction
                vs_compile = _row_speedup(report, result.entry, case.case, t.median_ms)
                table.add_row(
                    pattern,
                    act,
                    case.case,
                    result.entry,
                    result.status,
                    error_text,
                    f"{t.median_ms:.4f}",
                    "—" if t.tflops is None else f"{t.tflops:.1f}",
                    f"{t.gbps:.0f}",
                    "—" if fraction is None else f"{100 * fraction:.0f}%",
                    "—" if case.speedup is None else f"{case.speedup:.2f}×",
                    "—" if vs_compile is None else f"{vs_compile:.2f}×",
                )
    console.print(table)
    for target in targets:
        verdict = {True: "[green]met[/green]", False: "[red]missed[/red]", None: "n/a"}[target.met]
        measured = "—" if target.measured is None else f"{target.measured:.3f}"
        console.print(f"{target.name}: {measured} (goal {target.goal}) {verdict}")
    for report in reports.values():
        for result in report.failures:
            for case in result.cases:
                if not case.passed:
                    console.print(f"[red]FAIL[/red] {result.entry} {case.case}: {case.error}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("zoo_gpu.json"), help="JSON output")
    parser.add_argument(
        "--no-compile", action="store_true", help="skip the torch.compile entries (slow)"
    )
    args = parser.parse_args(argv)

    if os.environ.get("TRITON_INTERPRET") == "1":
        return _no_gpu("TRITON_INTERPRET=1 is set: unset it, interpreted Triton has no time")
    try:
        import torch
    except ImportError:
        return _no_gpu("torch is not installed (pip install 'traceq[zoo]')")
    if not torch.cuda.is_available():
        return _no_gpu("no CUDA GPU here (torch.cuda.is_available() is False); nothing to time")

    from traceq.zoo.check import check
    from traceq.zoo.registry import discover

    found = discover()
    for problem in found.problems:
        print(f"zoo_gpu: plugin problem {problem.source}: {problem.error}", file=sys.stderr)
    impls = {e.impl for e in found.entries}
    if args.no_compile:
        impls.discard("compile")

    reports: dict[tuple[str, str], Any] = {}
    for pattern, act in CHECKS:
        print(f"zoo_gpu: checking {pattern} act={act} ...", file=sys.stderr, flush=True)
        reports[(pattern, act)] = check(
            pattern, (ROWS, DIM, HIDDEN), DTYPE, "cuda", act, zoo=found, select=impls
        )
    targets = [
        gemm_epilogue_target(reports),
        glu_bandwidth_target(reports),
        dual_gemm_target(reports),
    ]
    device_name = torch.cuda.get_device_name()
    render(device_name, reports, targets)
    payload = {
        "device": device_name,
        "torch": torch.__version__,
        "dtype": DTYPE,
        "shape": {"rows": ROWS, "dim": DIM, "hidden": HIDDEN},
        "checks": [r.to_dict() for r in reports.values()],
        "targets": [t.to_dict() for t in targets],
    }
    args.out.write_text(json.dumps(payload, indent=2))
    print(f"zoo_gpu: wrote {args.out}", file=sys.stderr)
    return 0 if all(r.passed for r in reports.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
