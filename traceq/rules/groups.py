"""Findings grouped by identity: every occurrence of one `Finding.key()` and what they cost
together. The same split GEMM→GELU in 24 layers and 3 steps is one group of 72. A group can
carry a `fix_check` (a dict, attached later, e.g. by the zoo proving a fused kernel on this
group's shapes); every renderer shows it when present.

Plain data over findings, so an `Analysis` (`traceq.analyze`) and every report
(`traceq.reports.model`) group alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from traceq.rules.finding import SEVERITIES, Finding, normalize_module


@dataclass
class FindingGroup:
    """All occurrences of one finding key, and what they cost together."""

    key: str
    findings: list[Finding]
    fix_check: dict[str, Any] | None = None

    @property
    def first(self) -> Finding:
        """The occurrence with the largest saving: its message speaks for the group."""
        return max(self.findings, key=lambda f: (f.est_saving_us, f.time_us))

    @property
    def rule(self) -> str:
        return self.first.rule

    @property
    def name(self) -> str:
        return self.first.name

    @property
    def severity(self) -> str:
        return max((f.severity for f in self.findings), key=SEVERITIES.index)

    @property
    def count(self) -> int:
        return len(self.findings)

    @property
    def time_us(self) -> float:
        return sum(f.time_us for f in self.findings)

    @property
    def est_saving_us(self) -> float:
        return sum(f.est_saving_us for f in self.findings)

    @property
    def steps(self) -> list[int]:
        return sorted({f.step for f in self.findings if f.step is not None})

    @property
    def module(self) -> str | None:
        """The module all occurrences share, or the pattern they share (`layer.*.mlp`)."""
        modules = {f.module for f in self.findings}
        if len(modules) == 1:
            return next(iter(modules))
        patterns = {normalize_module(m) for m in modules if m is not None}
        return next(iter(patterns)) if len(patterns) == 1 else None

    @property
    def sites(self) -> list[str]:
        """The distinct module paths the occurrences ran in (call sites), in order."""
        return list(dict.fromkeys(f.module for f in self.findings if f.module))

    @property
    def layers(self) -> int:
        """How many repeated layers the sites are in (`layer_count`)."""
        return layer_count(self.sites)

    @property
    def where(self) -> str:
        """ "×24 in `encoder.layer.*.mlp`" (or just "×24", or "" for one occurrence). A group
        of an idiom (`evidence["idiom"]`), or one over several module patterns, also says
        its patterns and how many sites in how many layers: "×49 in `m.layers.*.norm` and
        `m.norm` (49 sites in 24 layers)"."""
        count = f"×{self.count}" if self.count > 1 else ""
        idiom = any("idiom" in f.evidence for f in self.findings)
        sites = self.sites
        if not (idiom or (self.module is None and len(sites) > 1)) or not sites:
            module = f"in `{self.module}`" if self.module else ""
            return " ".join(p for p in (count, module) if p)
        patterns = list(dict.fromkeys(normalize_module(m) or m for m in sites))
        shown = " and ".join(f"`{p}`" for p in patterns[:3])
        if len(patterns) > 3:
            shown = f"{len(patterns)} module patterns"
        layers = self.layers
        spread = f"{len(sites)} site{'s' if len(sites) > 1 else ''}"
        if layers > 1:
            spread += f" in {layers} layers"
        return " ".join(p for p in (count, f"in {shown} ({spread})") if p)

    def to_dict(self) -> dict[str, Any]:
        first = self.first
        return {
            "key": self.key,
            "rule": self.rule,
            "name": self.name,
            "severity": self.severity,
            "count": self.count,
            "module": self.module,
            "steps": self.steps,
            "message": first.message,
            "time_us": self.time_us,
            "est_saving_us": self.est_saving_us,
            "saving_model": first.saving_model,
            "fix": first.fix,
            "zoo": first.zoo,
            "shapes": first.shapes,
            "dtype": first.dtype,
            "fix_check": self.fix_check,
        }


def layer_count(modules: list[str]) -> int:
    """How many layers `modules` (module paths) spread over: the distinct prefixes up to the
    first path segment whose instance differs between paths of one pattern
    (`model.layers.3.mlp` and `model.layers.7.mlp` differ at `layers.3` / `layers.7`;
    `Qwen2DecoderLayer_0.Qwen2RMSNorm_1`, at `Qwen2DecoderLayer_0`). 0 when no segment
    differs (one site, or sites that repeat no layer)."""
    split = [m.split(".") for m in modules]
    depth = max((len(parts) for parts in split), default=0)
    for i in range(depth):
        by_pattern: dict[str, set[str]] = {}
        for parts in split:
            if len(parts) > i:
                prefix = ".".join(parts[: i + 1])
                by_pattern.setdefault(normalize_module(prefix) or prefix, set()).add(prefix)
        varied = [prefixes for prefixes in by_pattern.values() if len(prefixes) > 1]
        if varied:
            return sum(len(prefixes) for prefixes in varied)
    return 0


def group_findings(findings: list[Finding]) -> list[FindingGroup]:
    """Occurrences grouped by `Finding.key()`, largest total saving first."""
    groups: dict[str, list[Finding]] = {}
    for f in findings:
        groups.setdefault(f.key(), []).append(f)
    ordered = [FindingGroup(key, items) for key, items in groups.items()]
    ordered.sort(key=lambda g: (-g.est_saving_us, -g.time_us, g.rule, g.key))
    return ordered
