"""The rule engine: what a rule is, how rules are found (catalogue and entry-point plugins),
how they run, and what a finding is.

Plugins are tested the way pip installs them: a throwaway `*.dist-info` with an
`entry_points.txt` on `sys.path`, discovered through `importlib.metadata`.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import polars as pl
import pytest

import traceq
from traceq.rules import Context, Finding, Rule, rule
from traceq.rules.catalogue import MODULES, RULES
from traceq.rules.config import Config
from traceq.rules.engine import ENTRY_POINT_GROUP, RuleSet, discover, run
from traceq.rules.finding import normalize_module

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
LINEAR = FIXTURES / "linear-eager.pt.trace.json.gz"
SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead", "References")


@pytest.fixture(scope="module")
def linear() -> traceq.Trace:
    return traceq.load(LINEAR)


def _op_rule(code: str, name: str, saving_per_op: float, **kwargs) -> Rule:
    """A rule that reports every top-level aten op with a saving proportional to its index."""

    @rule(code, name, "warning", defaults={"factor": 1.0}, **kwargs)
    def check(ctx: Context):
        """## What it does
        Reports top-level ops. Used by the engine tests.
        """
        top = ctx.trace.ops.filter(pl.col("depth") == 0).sort("ts_ns")
        for i, event in enumerate(top["event"].to_list()):
            yield ctx.finding(
                message=f"op {event}",
                ops=[event],
                est_saving_us=saving_per_op * i * ctx.options["factor"],
            )

    return check


# -- Rule ---------------------------------------------------------------------------------


def test_rule_decorator_makes_a_rule_whose_doc_is_the_docstring() -> None:
    made = _op_rule("TQ901", "top-ops", 1.0)
    assert isinstance(made, Rule)
    assert (made.code, made.name, made.severity) == ("TQ901", "top-ops", "warning")
    assert made.doc.startswith("## What it does\nReports top-level ops.")
    assert made.summary == "Reports top-level ops."
    assert dict(made.defaults) == {"factor": 1.0}


@pytest.mark.parametrize(
    ("code", "name", "severity"),
    [("tq1", "x", "info"), ("TQ1", "Not_Kebab", "info"), ("TQ1", "ok-name", "fatal")],
)
def test_rule_rejects_bad_codes_names_and_severities(code: str, name: str, severity: str) -> None:
    with pytest.raises(ValueError):
        Rule(code, name, severity, lambda ctx: [])


def test_rule_defaults_cannot_be_changed_after_definition() -> None:
    made = _op_rule("TQ902", "frozen", 1.0)
    with pytest.raises(TypeError):
        made.defaults["factor"] = 2.0  # type: ignore[index]


# -- the catalogue ------------------------------------------------------------------------


def test_catalogue_lists_the_builtin_rules_in_code_order() -> None:
    codes = [r.code for r in RULES]
    assert codes == [
        "TQ101", "TQ102", "TQ103", "TQ104", "TQ105", "TQ106", "TQ107", "TQ108", "TQ109", "TQ110",
        "TQ201", "TQ202", "TQ203", "TQ204", "TQ205", "TQ206", "TQ207", "TQ208", "TQ209",
        "TQ210", "TQ211", "TQ212",
        "TQ301", "TQ302", "TQ303", "TQ304",
        "TQ401", "TQ402", "TQ403", "TQ404",
    ]  # fmt: skip
    for module, built in zip(MODULES, RULES, strict=True):
        name = module.__name__.removeprefix("traceq.rules.")
        assert module.RULE is built
        assert name == f"{built.code.lower()}_{built.name.replace('-', '_')}"


@pytest.mark.parametrize("built", RULES, ids=[r.code for r in RULES])
def test_every_builtin_doc_has_ruffs_sections_in_order(built: Rule) -> None:
    headings = re.findall(r"^## (.+)$", built.doc, re.M)
    assert [h for h in headings if h in SECTIONS] == list(SECTIONS)  # extra sections allowed


# -- discovery and plugins ----------------------------------------------------------------


def _plugin_dist(tmp_path: Path, module: str, body: str, entry_points: str) -> None:
    (tmp_path / f"{module}.py").write_text(body)
    dist = tmp_path / f"{module}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{entry_points}\n")


PLUGIN = '''
from traceq.rules import rule

@rule("XP001", "plugin-check", "info", defaults={"limit": 3})
def plugin_check(ctx):
    """## What it does
    Says hello once per trace.
    """
    yield ctx.finding(message="hello", est_saving_us=1.0)

@rule("XP002", "plugin-crash", "error")
def plugin_crash(ctx):
    """## What it does
    Crashes.
    """
    raise RuntimeError("plugin bug")
    yield

@rule("TQ201", "stolen-code", "info")
def stolen(ctx):
    """Uses a built-in code."""
    return []

RULES = [plugin_check, plugin_crash]
NOT_RULES = 42
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _plugin_dist(
        tmp_path,
        "tq_plugin_demo",
        PLUGIN,
        "demo = tq_plugin_demo:RULES\n"
        "missing = tq_plugin_absent_module:RULES\n"
        "wrong = tq_plugin_demo:NOT_RULES\n"
        "clash = tq_plugin_demo:stolen",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()


def test_discover_adds_plugin_rules_after_the_builtins(plugin: None) -> None:
    ruleset = discover()
    codes = [r.code for r in ruleset.rules]
    assert codes[: len(RULES)] == [r.code for r in RULES]
    assert codes[len(RULES) :] == ["XP001", "XP002"]
    assert ruleset.origin["XP001"] == "tq_plugin_demo"
    assert ruleset.origin["TQ201"] == "builtin"


def test_broken_plugins_are_reported_not_fatal(plugin: None) -> None:
    problems = [str(p) for p in discover().problems]
    assert any("'missing'" in p and "failed to load" in p for p in problems)
    assert any("'wrong'" in p and "not a Rule" in p for p in problems)
    assert any("'clash'" in p and "clashes with TQ201" in p for p in problems)
    assert len(problems) == 3


def test_a_plugin_rule_that_raises_is_reported_and_the_rest_still_run(
    plugin: None, linear: traceq.Trace
) -> None:
    result = run(linear, Config(select=("XP", "TQ204")))
    assert [f.rule for f in result.findings if f.rule.startswith("XP")] == ["XP001"]
    assert any(str(p) == "rule XP002: RuntimeError: plugin bug" for p in result.problems), (
        result.problems
    )


def test_a_builtin_rule_that_raises_propagates(linear: traceq.Trace) -> None:
    @rule("TQ999", "builtin-bug", "info")
    def bug(ctx: Context):
        """Crashes."""
        raise ZeroDivisionError("bug")
        yield

    ruleset = RuleSet(rules=[bug], origin={"TQ999": "builtin"})
    with pytest.raises(ZeroDivisionError):
        run(linear, Config(), ruleset=ruleset)


# -- running ------------------------------------------------------------------------------


def test_run_sorts_findings_by_estimated_saving(linear: traceq.Trace) -> None:
    ruleset = RuleSet(rules=[_op_rule("TQ901", "top-ops", 2.0)], origin={"TQ901": "builtin"})
    result = run(linear, Config(), ruleset=ruleset)
    savings = [f.est_saving_us for f in result.findings]
    top_level = linear.ops.filter(pl.col("depth") == 0).height
    assert len(savings) == top_level > 1
    assert savings == sorted(savings, reverse=True)
    assert savings[0] == 2.0 * (top_level - 1)


def test_run_gives_each_rule_its_configured_options(linear: traceq.Trace) -> None:
    ruleset = RuleSet(rules=[_op_rule("TQ901", "top-ops", 1.0)], origin={"TQ901": "builtin"})
    result = run(linear, Config(rules={"TQ901": {"factor": 10}}), ruleset=ruleset)
    assert result.options["TQ901"] == {"factor": 10.0}
    assert max(f.est_saving_us for f in result.findings) == 10.0 * (len(result.findings) - 1)


def test_engine_fills_op_names_from_the_trace(linear: traceq.Trace) -> None:
    ruleset = RuleSet(rules=[_op_rule("TQ901", "top-ops", 1.0)], origin={"TQ901": "builtin"})
    result = run(linear, Config(), ruleset=ruleset)
    events = linear.events
    names = dict(zip(events["event"].to_list(), events["name"].to_list(), strict=True))
    for finding in result.findings:
        assert finding.evidence["op_names"] == [names[e] for e in finding.ops]


def test_rules_share_one_cache_per_run(linear: traceq.Trace) -> None:
    seen: list[object] = []

    def make(code: str) -> Rule:
        @rule(code, f"cache-{code.lower()}", "info")
        def check(ctx: Context):
            """Reads the shared cache."""
            seen.append(ctx.cached("answer", object))
            return []

        return check

    rules = [make("TQ901"), make("TQ902")]
    run(
        linear,
        Config(),
        ruleset=RuleSet(rules, origin=dict.fromkeys(["TQ901", "TQ902"], "builtin")),
    )
    assert len(seen) == 2 and seen[0] is seen[1]


def test_context_finding_fills_code_name_severity_and_zoo(linear: traceq.Trace) -> None:
    made = _op_rule("TQ901", "top-ops", 1.0, zoo=("mlp",))
    ctx = Context(linear, made, made.defaults, device=None)  # type: ignore[arg-type]
    finding = ctx.finding(message="m")
    assert (finding.rule, finding.name, finding.severity, finding.zoo) == (
        "TQ901",
        "top-ops",
        "warning",
        ["mlp"],
    )
    assert ctx.finding(message="m", severity="info").severity == "info"


# -- Finding ------------------------------------------------------------------------------


def test_finding_round_trips_through_a_dict() -> None:
    finding = Finding(
        rule="TQ102",
        name="split-gemm-activation",
        severity="warning",
        message="m",
        step=3,
        module="encoder.layer.3.mlp",
        ops=[1, 2],
        kernels=[7],
        shapes=[[8, 768]],
        dtype="bf16",
        time_us=5.0,
        est_saving_us=2.5,
        saving_model="model",
        fix="fix",
        zoo=["gemm_bias_act"],
        evidence={"op_names": ["aten::linear", "aten::gelu"]},
    )
    data = finding.to_dict()
    assert Finding.from_dict({**data, "from_a_newer_version": 1}) == finding


def test_finding_rejects_an_unknown_severity() -> None:
    with pytest.raises(ValueError):
        Finding(rule="TQ1", name="x", severity="fatal", message="m")


@pytest.mark.parametrize(
    ("module", "normalized"),
    [
        ("encoder.layer.3.mlp", "encoder.layer.*.mlp"),
        ("Model_0.Layer_12.MLP_0", "Model_*.Layer_*.MLP_*"),
        ("h.0.attn", "h.*.attn"),
        ("plain", "plain"),
        (None, None),
    ],
)
def test_normalize_module_replaces_instance_indices(module, normalized) -> None:
    assert normalize_module(module) == normalized


def test_key_groups_layers_and_steps_but_not_shapes() -> None:
    def make(module: str, step: int, shapes: list[list[int]]) -> Finding:
        return Finding(
            rule="TQ102",
            name="n",
            severity="info",
            message="m",
            step=step,
            module=module,
            shapes=shapes,
            evidence={"op_names": ["aten::linear", "aten::gelu"]},
        )

    a = make("enc.layer.1.mlp", 1, [[8, 768]])
    b = make("enc.layer.7.mlp", 2, [[8, 768]])
    c = make("enc.layer.7.mlp", 2, [[8, 1024]])
    assert a.key() == b.key() == "TQ102|enc.layer.*.mlp|aten::linear,aten::gelu|8x768"
    assert c.key() != a.key()
