"""``torch.compile`` of the split ``add_rms_norm`` reference: add and norm in one kernel."""

from __future__ import annotations

from traceq.zoo.add_rms_norm import reference
from traceq.zoo.compiled import compiled_entry

ENTRY = compiled_entry(reference.ENTRY)
