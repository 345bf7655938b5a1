"""One problem, one finding: ops an idiom finding explains are not reported again.

An idiom rule recognises what a group of ops computes (a GLU, an RMSNorm, a rotary
embedding, attention) and names the one fix for it. The generic fusion rules see the same
ops as fragments (TQ104's `mul → to → mul` is the tail of an RMSNorm, its `mul → mul → add`
half a RoPE), and their generic fix ("fuse the chain") hides the specific one. So:

- a rule declares `explains=True` (`@rule(..., explains=True)`) when its findings account
  for their ops; a finding may narrow that to `evidence["explains"]` (TQ103's GLU explains
  its activation and multiply, not the gate and up GEMMs, which stay TQ105's);
- a rule declares `defers=True` when its findings give way to those explanations;
- the engine runs the explaining rules first and hands the union of what they explained to
  the others as `Context.explained`; TQ104 leaves those ops out before it builds chains (a
  partly explained chain shrinks to what is left, or goes if that is no chain), and after
  the run `drop_explained` removes any deferring finding whose ops are all explained.

Which ops are explained depends only on the findings the run made: a rule left out by
`--select` explains nothing, and the generic rules then report what they see.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from traceq.rules.finding import Finding

#: The `Context` cache entry holding the explained op events (a frozenset of ints).
CACHE_KEY = "explained_ops"

#: The evidence key by which a finding names the ops it explains, when not all its `ops`.
EVIDENCE_KEY = "explains"


def explained_by(finding: Finding) -> list[int]:
    """The op events `finding` explains: `evidence["explains"]` when given, else its ops."""
    named = finding.evidence.get(EVIDENCE_KEY)
    return list(named) if named is not None else list(finding.ops)


def explained_ops(findings: Iterable[Finding]) -> frozenset[int]:
    """Every op event some finding of `findings` explains."""
    return frozenset(e for f in findings for e in explained_by(f))


def drop_explained(
    findings: Sequence[Finding], explained: frozenset[int], deferring: Iterable[str]
) -> list[Finding]:
    """`findings` less those of a `deferring` rule all of whose ops are `explained`."""
    codes = set(deferring)
    if not explained or not codes:
        return list(findings)
    return [f for f in findings if not (f.rule in codes and f.ops and set(f.ops) <= explained)]
