"""Configuration like ruff's: select/ignore by code or prefix, per-rule thresholds from
`[tool.traceq]` / `traceq.toml` / the command line, and one-line errors for anything
unknown (a typo must not silently leave a default in force)."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceq.analyze import analyze
from traceq.perf.device import cpu_model
from traceq.rules.catalogue import RULES
from traceq.rules.config import (
    Config,
    ConfigError,
    find_config,
    load_config,
    parse_option,
    parse_options,
    rule_options,
    selected,
)
from traceq.rules.engine import run

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
ALL = [r.code for r in RULES]


def codes(config: Config) -> list[str]:
    return [r.code for r in selected(RULES, config)]


def by_code(code: str):
    return next(r for r in RULES if r.code == code)


# -- selection ----------------------------------------------------------------------------


def test_default_selects_every_rule() -> None:
    assert codes(Config()) == ALL


@pytest.mark.parametrize(
    ("select", "ignore", "expected"),
    [
        (("TQ1",), (), [c for c in ALL if c.startswith("TQ1")]),
        (("TQ20",), (), [c for c in ALL if c.startswith("TQ20")]),
        (("TQ201", "TQ3"), (), ["TQ201"] + [c for c in ALL if c.startswith("TQ3")]),
        (None, ("TQ1", "TQ2"), [c for c in ALL if c[2] not in "12"]),
        (("TQ2",), ("TQ205",), [c for c in ALL if c.startswith("TQ2") and c != "TQ205"]),
        # the more specific selector wins, like ruff: ignore TQ2 but select TQ201
        (("ALL", "TQ201"), ("TQ2",), [c for c in ALL if not c.startswith("TQ2")] + ["TQ201"]),
        (("TQ102",), ("TQ102",), []),  # a tie goes to ignore
    ],
)
def test_select_and_ignore_by_code_or_prefix(select, ignore, expected) -> None:
    assert codes(Config(select=select, ignore=ignore)) == sorted(expected)


@pytest.mark.parametrize("selector", ["TQ9", "TQ2011", "XX"])
def test_unknown_code_or_prefix_is_an_error(selector: str) -> None:
    with pytest.raises(ConfigError, match=f"unknown rule code or prefix '{selector}'"):
        codes(Config(select=(selector,)))
    with pytest.raises(ConfigError, match="unknown rule code or prefix"):
        codes(Config(ignore=(selector,)))


def test_command_line_select_replaces_and_ignore_adds() -> None:
    file = Config(select=("TQ1",), ignore=("TQ105",))
    merged = file.merged(select=["TQ2"], ignore=["TQ205"])
    assert merged.select == ("TQ2",)
    assert merged.ignore == ("TQ105", "TQ205")
    assert codes(merged) == [c for c in ALL if c.startswith("TQ2") and c != "TQ205"]


# -- options ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("TQ201.min_gap_us=5", ("TQ201", "min_gap_us", 5)),
        ("TQ201.min_gap_us = 2.5", ("TQ201", "min_gap_us", 2.5)),
        ("TQ202.include_outside_steps=true", ("TQ202", "include_outside_steps", True)),
        ("launch-bound.window=8", ("launch-bound", "window", 8)),
        ("TQ1.mode=fast", ("TQ1", "mode", "fast")),
    ],
)
def test_parse_option_reads_values_as_toml(text: str, parsed) -> None:
    assert parse_option(text) == parsed


@pytest.mark.parametrize("text", ["TQ201", "TQ201=5", "min_gap_us=5", ".x=1"])
def test_malformed_option_is_an_error(text: str) -> None:
    with pytest.raises(ConfigError, match=r"must look like CODE\.option=value"):
        parse_option(text)


def test_options_layer_defaults_config_then_command_line() -> None:
    tq201 = by_code("TQ201")
    file = Config(rules={"TQ201": {"min_gap_us": 5, "window": 8}})
    merged = file.merged(options=parse_options(["TQ201.window=32"]))
    options = rule_options(tq201, merged)
    assert options["min_gap_us"] == 5.0 and isinstance(options["min_gap_us"], float)
    assert options["window"] == 32
    assert options["min_kernels"] == tq201.defaults["min_kernels"]


def test_options_may_name_a_rule_by_its_kebab_name() -> None:
    options = rule_options(by_code("TQ201"), Config(rules={"launch-bound": {"window": 4}}))
    assert options["window"] == 4


def test_unknown_option_names_the_rule_and_its_options() -> None:
    with pytest.raises(ConfigError, match=r"TQ201 \(launch-bound\) has no option 'min_gap'"):
        rule_options(by_code("TQ201"), Config(rules={"TQ201": {"min_gap": 5}}))


@pytest.mark.parametrize(("key", "value"), [("min_gap_us", "five"), ("window", 2.5)])
def test_option_of_the_wrong_type_is_an_error(key: str, value) -> None:
    with pytest.raises(ConfigError, match=f"TQ201.{key} must be"):
        rule_options(by_code("TQ201"), Config(rules={"TQ201": {key: value}}))


def test_options_for_an_unknown_rule_are_an_error() -> None:
    trace = _geglu()
    with pytest.raises(ConfigError, match="options given for unknown rule 'TQ999'"):
        run(trace, Config(rules={"TQ999": {"x": 1}}))


# -- files --------------------------------------------------------------------------------


def test_pyproject_table_is_read(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text(
        '[project]\nname = "x"\n\n[tool.traceq]\nselect = ["TQ2"]\nignore = ["TQ205"]\n'
        'fail-on = "warning"\n\n[tool.traceq.rules.TQ201]\nmin_gap_us = 5\n\n'
        "[tool.traceq.device]\nmemory_bandwidth_gbs = 2000\n"
    )
    config = load_config(path)
    assert config.select == ("TQ2",) and config.ignore == ("TQ205",)
    assert config.rules == {"TQ201": {"min_gap_us": 5}}
    assert config.device == {"memory_bandwidth_gbs": 2000}
    assert config.fail_on == "warning" and config.path == path


def test_traceq_toml_is_the_table_itself(tmp_path: Path) -> None:
    path = tmp_path / "traceq.toml"
    path.write_text('select = ["TQ3"]\n[rules.TQ302]\nmin_share = 0.2\n')
    config = load_config(path)
    assert codes(config) == [c for c in ALL if c.startswith("TQ3")]
    assert rule_options(by_code("TQ302"), config)["min_share"] == 0.2


def test_find_config_walks_up_from_the_trace(tmp_path: Path) -> None:
    deep = tmp_path / "runs" / "2024" / "a"
    deep.mkdir(parents=True)
    trace = deep / "t.json"
    trace.write_text("{}")
    (tmp_path / "pyproject.toml").write_text("[tool.traceq]\nselect = ['TQ1']\n")
    # a pyproject without [tool.traceq] on the way is skipped
    (tmp_path / "runs" / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert find_config(trace) == tmp_path / "pyproject.toml"
    (deep / "traceq.toml").write_text("select = ['TQ2']\n")
    assert find_config(trace) == deep / "traceq.toml"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("selec = ['TQ1']\n", "unknown setting 'selec'"),
        ("select = 3\n", "'select'"),
        ("[rules]\nTQ201 = 5\n", "'rules'"),
        ("select = [\n", "cannot read configuration"),
    ],
)
def test_bad_configuration_files_are_one_line_errors(tmp_path: Path, text, message) -> None:
    path = tmp_path / "traceq.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_missing_configuration_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")


# -- device overrides and the Python API -----------------------------------------------


def test_device_figures_can_be_configured() -> None:
    model = cpu_model().with_overrides({"memory_bandwidth_gbs": 120.0})
    assert model.memory_bandwidth_gbs == 120.0
    assert "configured: memory_bandwidth_gbs" in model.source
    with pytest.raises(ConfigError, match="unknown device setting 'bandwith'"):
        cpu_model().with_overrides({"bandwith": 1})


def _geglu():
    import traceq

    return traceq.load(FIXTURES / "geglu_mlp-eager.pt.trace.json.gz")


def test_analyze_api_takes_select_ignore_and_a_config_dict() -> None:
    trace = _geglu()
    every = analyze(trace, select="TQ204")
    assert every and {f.rule for f in every} == {"TQ204"}
    # a share threshold above every step's share leaves nothing
    top = max(f.evidence["share"] for f in every)
    config = {"rules": {"TQ204": {"min_share": round(top + 0.01, 4)}}}
    assert analyze(trace, select=["TQ204"], config=config) == []
    assert analyze(trace, select="TQ2", ignore="TQ204") == [
        f for f in analyze(trace, select="TQ2") if f.rule != "TQ204"
    ]
