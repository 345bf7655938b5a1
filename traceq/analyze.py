"""`analyze(trace)`: run the rule catalogue on a loaded trace and return its `Analysis`.

The Python face of `traceq analyze`: the same selection and thresholds as the CLI, given
as arguments instead of flags. Configuration files are read only when asked (`config=`
a path); the CLI is what looks for one next to the trace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceq.rules.config import Config, load_config
from traceq.rules.engine import Analysis, run

if TYPE_CHECKING:
    from traceq.perf.device import DeviceModel
    from traceq.trace import Trace

ConfigLike = Config | Mapping[str, Any] | str | Path | None


def analyze(
    trace: Trace,
    select: Sequence[str] | str | None = None,
    ignore: Sequence[str] | str | None = None,
    config: ConfigLike = None,
    *,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    device: DeviceModel | None = None,
) -> Analysis:
    """The findings of the selected rules, largest estimated saving first, as an `Analysis`:
    a sequence of `Finding`s (iterate, index, compare with a list) with `groups`,
    `summary`, `total_saving_us` (each µs counted once) and the time it is a share of
    (`share_of`), `notices` (what the trace lacks), and `to_polars()`.

    `select` / `ignore`: rule codes or prefixes (`"TQ1"`, `["TQ201", "TQ3"]`); `config`: a
    `Config`, the `[tool.traceq]` table as a dict, or the path of a `traceq.toml` /
    `pyproject.toml`; `options`: per-rule thresholds on top, e.g.
    `{"TQ201": {"min_gap_us": 5}}`; `device`: a `DeviceModel` replacing the one read from
    the trace. Unknown codes or options raise `traceq.rules.config.ConfigError`.
    """
    return analysis(
        trace, select=select, ignore=ignore, config=config, options=options, device=device
    )


def analysis(
    trace: Trace,
    select: Sequence[str] | str | None = None,
    ignore: Sequence[str] | str | None = None,
    config: ConfigLike = None,
    *,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    device: DeviceModel | None = None,
) -> Analysis:
    """`analyze` by its older name (the same `Analysis`: the rules that ran, the device
    model, per-rule timings and plugin problems beside the findings)."""
    base = as_config(config)
    merged = base.merged(
        select=_codes(select),
        ignore=_codes(ignore) or (),
        options={str(k): dict(v) for k, v in (options or {}).items()},
    )
    return run(trace, merged, device=device)


def as_config(config: ConfigLike) -> Config:
    if config is None:
        return Config()
    if isinstance(config, Config):
        return config
    if isinstance(config, (str, Path)):
        return load_config(config)
    return Config.from_table(config)


def _codes(value: Sequence[str] | str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = [value] if isinstance(value, str) else list(value)
    codes = [c.strip().upper() for item in items for c in item.split(",") if c.strip()]
    return tuple(codes) or None
