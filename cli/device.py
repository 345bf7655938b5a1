"""`traceq device calibrate`: measure this machine's achievable peaks into a spec file;
`traceq device show TRACE`: the spec a trace's device is matched to."""

from __future__ import annotations

import click
from traceq.cli.common import echo_json, load, trace_argument

from traceq.perf.calibrate import calibrate as measure
from traceq.perf.calibrate import write_spec
from traceq.perf.roofline import trace_spec


@click.group()
def device() -> None:
    """The device model: datasheet peaks, and achievable ones measured here."""


@device.command()
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    default="traceq-device.json",
    show_default=True,
    help="Where to write the spec file (`traceq roofline --spec FILE` reads it).",
)
def calibrate(output: str) -> None:
    """Time large GEMMs per dtype and a device copy on this machine's GPU, and write the
    achievable TFLOP/s and GB/s as a spec file. Needs a CUDA or ROCm GPU."""
    spec = measure()  # CalibrationError (a TraceError): one line, exit 2
    path = write_spec(spec, output)
    peaks = ", ".join(f"{d} {v:,.0f}" for d, v in spec["peak_tflops"].items() if v)
    click.echo(f"{spec['name']}: {peaks} TFLOP/s; copy {spec['hbm_gbs']:,.0f} GB/s -> {path}")


@device.command()
@trace_argument
def show(trace: str) -> None:
    """The datasheet spec TRACE's device is matched to (JSON), or why there is none."""
    spec = trace_spec(load(trace))
    if spec is None:
        click.echo("no spec: a CPU-only trace, or a device not in traceq's table")
        return
    echo_json(spec.to_dict())
