"""``torch.compile`` of the split ``gemm_bias_act`` reference.

Inductor's own fusion of the eager code, unaided: the bar a hand-written kernel must beat.
"""

from __future__ import annotations

from traceq.zoo.compiled import compiled_entry
from traceq.zoo.gemm_bias_act import reference

ENTRY = compiled_entry(reference.ENTRY)
