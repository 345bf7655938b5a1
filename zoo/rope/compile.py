"""``torch.compile`` of the split ``rope`` reference: one pointwise kernel for q and k."""

from __future__ import annotations

from traceq.zoo.compiled import compiled_entry
from traceq.zoo.rope import reference

ENTRY = compiled_entry(reference.ENTRY)
