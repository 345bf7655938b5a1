"""Each µs saved once: moved to `traceq.rules.counted`, so an `Analysis` (`traceq.analyze`)
totals its findings as every report does; this name stays for code that imports it here."""

from traceq.rules.counted import (  # noqa: F401 (re-exported)
    EMPTY,
    Intervals,
    _difference,
    _insert,
    _length,
    _merge,
    counted_savings,
)
