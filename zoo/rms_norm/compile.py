"""``torch.compile`` of the split ``rms_norm`` reference: Inductor's one reduction kernel."""

from __future__ import annotations

from traceq.zoo.compiled import compiled_entry
from traceq.zoo.rms_norm import reference

ENTRY = compiled_entry(reference.ENTRY)
