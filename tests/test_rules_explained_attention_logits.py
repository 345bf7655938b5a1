"""TQ106 (attention) and TQ109 (materialized logits) explain their ops: the generic rules
(TQ104 chains, TQ102, TQ105) no longer report fragments of an attention or a loss that an
idiom finding already names with its one fix (`traceq.rules.explained`).

TQ104's default `min_ops` (3) finds no chain inside these attentions; at 2 it reports the
scores' `mul(scale) → add(mask)` (`masked_fill` in the TP model), which is what an idiom
finding must keep from being repeated.
"""

from __future__ import annotations

import pytest
from conftest import FIXTURES

import traceq
from traceq.rules.catalogue import RULES
from traceq.rules.config import Config
from traceq.rules.engine import run

CORPUS = FIXTURES / "corpus"
GENERIC = ["TQ102", "TQ104", "TQ105"]
IDIOMS = ["TQ106", "TQ109"]
SHORT_CHAINS = {"TQ104": {"min_ops": 2}}


def test_attention_and_logits_rules_declare_that_they_explain() -> None:
    by_code = {r.code: r for r in RULES}
    assert all(by_code[code].explains for code in IDIOMS)


@pytest.mark.parametrize("name", ["bert_eager", "llama_eager", "gpt2_eager", "gpt2_train_ce"])
def test_generic_rules_do_not_repeat_the_ops_of_attention_or_logits(name: str) -> None:
    trace = traceq.load(CORPUS / f"{name}.pt.trace.json.gz", execution_trace=False)
    idiom = run(trace, Config(select=IDIOMS)).findings
    assert idiom, "the corpus trace has an attention or a logits finding"
    explained = {e for f in idiom for e in f.ops}

    def repeated(select: list[str]) -> list[list[str]]:
        findings = run(trace, Config(select=select, rules=SHORT_CHAINS)).findings
        return [
            f.evidence["op_names"] for f in findings if f.rule in GENERIC and set(f.ops) & explained
        ]

    alone = repeated(GENERIC)  # without the idiom rules, TQ104 sees the fragments
    assert alone and all(len(names) == 2 for names in alone)
    assert repeated(GENERIC + IDIOMS) == []
