"""``torch.compile`` of the split ``mlp`` reference.

Inductor's own fusion of the eager code, unaided: the bar a hand-written kernel must beat.
"""

from __future__ import annotations

from traceq.zoo.compiled import compiled_entry
from traceq.zoo.mlp import reference

ENTRY = compiled_entry(reference.ENTRY)
