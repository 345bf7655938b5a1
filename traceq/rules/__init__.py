"""Rules: documented checks that turn a trace's relations into findings.

`base` defines what a rule is, `finding` what it reports, `config` how thresholds and
selections are chosen, `engine` how rules are discovered and run, and one module per rule
(`tqNNN_<name>.py`) holds each check. The catalogue (`catalogue.RULES`) lists the built-ins.
"""

from traceq.rules.base import Context, Rule, rule
from traceq.rules.finding import SEVERITIES, Finding

__all__ = ["SEVERITIES", "Context", "Finding", "Rule", "rule"]
