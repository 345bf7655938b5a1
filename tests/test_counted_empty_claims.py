"""A finding that saves nothing claims nothing: before, its zero-length claims entered the
claimed intervals and broke their order, so two GPU-idle findings over one step counted
the same idle time twice (TraceLens's ViT H100 trace: TQ303's 0 µs findings let TQ204
count 910 µs where 574 µs of its step's idle time was left after TQ201)."""

from __future__ import annotations

import numpy as np

from traceq.rules.counted import _difference, _insert, _length


def test_an_empty_claim_then_a_claim_around_it_unclaims_nothing() -> None:
    """As in the trace: a 0 µs finding claims empty pieces at its kernels' starts, then a
    GPU-idle finding claims an interval that spans one of them."""
    nothing = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    claimed = _insert(nothing, (np.array([30]), np.array([30])))
    free = _difference((np.array([20]), np.array([40])), claimed)
    claimed = _insert(claimed, free)
    whole = (np.array([0]), np.array([100]))
    assert _length(_difference(whole, claimed)) == 100 - 20  # before: 90
