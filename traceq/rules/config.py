"""Which rules run and with which thresholds, chosen the way ruff chooses lint rules.

Sources, later ones winning: each rule's `defaults`, then the configuration file (the
`[tool.traceq]` table of a `pyproject.toml`, or a `traceq.toml` whose top level is that
table), then the command line (`--select`, `--ignore`, `--option TQ201.min_gap_us=5`).

- `select` / `ignore` take codes or code prefixes (`TQ1`, `TQ20`, `TQ201`) or `ALL`. A rule
  runs when its most specific matching `select` entry is more specific than its most
  specific matching `ignore` entry, so `ignore = ["TQ2"]` with `select = ["TQ201"]` still
  runs TQ201. A command-line `--select` replaces the file's; `--ignore` adds to it.
- Per-rule thresholds: `[tool.traceq.rules.TQ201] min_gap_us = 5` (a rule's kebab-case
  name works too). Device figures: `[tool.traceq.device] memory_bandwidth_gbs = 2000`.

A name that matches no rule and an option a rule does not have are errors, not silently
ignored: a typo in a threshold would otherwise leave the default in force.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceq.errors import ConfigError
from traceq.rules.base import Rule

CONFIG_FILES = ("traceq.toml", "pyproject.toml")
TOP_LEVEL_KEYS = ("select", "ignore", "rules", "device", "fail-on", "fail_on")


@dataclass(frozen=True)
class Config:
    """Settings from one configuration file (or none): selection, thresholds, device."""

    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    rules: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    device: Mapping[str, Any] = field(default_factory=dict)
    fail_on: str | None = None
    path: Path | None = None

    @classmethod
    def from_table(cls, table: Mapping[str, Any], path: Path | None = None) -> Config:
        """From the `[tool.traceq]` table (already parsed TOML, or a dict in Python)."""
        where = f" in {path}" if path else ""
        unknown = sorted(set(table) - set(TOP_LEVEL_KEYS))
        if unknown:
            raise ConfigError(
                f"unknown setting {unknown[0]!r}{where}; known: select, ignore, rules, "
                "device, fail-on"
            )
        rules = table.get("rules", {})
        device = table.get("device", {})
        if not isinstance(rules, Mapping) or not all(
            isinstance(v, Mapping) for v in rules.values()
        ):
            raise ConfigError(f"'rules'{where} must be a table of tables, e.g. [rules.TQ201]")
        if not isinstance(device, Mapping):
            raise ConfigError(f"'device'{where} must be a table")
        select = table.get("select")
        fail_on = table.get("fail-on", table.get("fail_on"))
        return cls(
            select=None if select is None else _codes(select, "select", where),
            ignore=_codes(table.get("ignore", ()), "ignore", where),
            rules={str(k): dict(v) for k, v in rules.items()},
            device=dict(device),
            fail_on=fail_on,
            path=path,
        )

    def merged(
        self,
        *,
        select: Sequence[str] | None = None,
        ignore: Sequence[str] = (),
        options: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> Config:
        """This configuration with command-line settings on top (select replaces)."""
        rules = {code: dict(values) for code, values in self.rules.items()}
        for code, values in (options or {}).items():
            rules.setdefault(code, {}).update(values)
        return Config(
            select=tuple(select) if select else self.select,
            ignore=(*self.ignore, *ignore),
            rules=rules,
            device=self.device,
            fail_on=self.fail_on,
            path=self.path,
        )


def load_config(path: str | Path) -> Config:
    """Read a `traceq.toml` (top-level table) or a `pyproject.toml` (`[tool.traceq]`)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"configuration file not found: {path}") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read configuration {path}: {exc}") from None
    if path.name == "pyproject.toml":
        data = data.get("tool", {}).get("traceq", {})
    return Config.from_table(data, path)


def find_config(start: str | Path) -> Path | None:
    """The nearest `traceq.toml`, or `pyproject.toml` with a `[tool.traceq]` table, from
    `start` (a file's directory, or a directory) upward."""
    here = Path(start).resolve()
    if not here.is_dir():
        here = here.parent
    for directory in (here, *here.parents):
        local = directory / "traceq.toml"
        if local.is_file():
            return local
        pyproject = directory / "pyproject.toml"
        if pyproject.is_file() and _has_traceq_table(pyproject):
            return pyproject
    return None


def parse_option(text: str) -> tuple[str, str, Any]:
    """`TQ201.min_gap_us=5` -> ('TQ201', 'min_gap_us', 5); the value is read as TOML, so
    `5`, `2.5`, `true` and `"name"` keep their types and a bare word stays a string."""
    target, sep, raw = text.partition("=")
    rule_ref, dot, key = target.strip().partition(".")
    if not sep or not dot or not rule_ref or not key:
        raise ConfigError(
            f"option {text!r} must look like CODE.option=value, e.g. TQ201.min_gap_us=5"
        )
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return rule_ref, key.strip(), value


def parse_options(texts: Iterable[str]) -> dict[str, dict[str, Any]]:
    options: dict[str, dict[str, Any]] = {}
    for text in texts:
        rule_ref, key, value = parse_option(text)
        options.setdefault(rule_ref, {})[key] = value
    return options


def selected(rules: Sequence[Rule], config: Config) -> list[Rule]:
    """The rules `config` enables, in catalogue order; unknown selectors are errors."""
    select = config.select if config.select is not None else ("ALL",)
    for selector in (*select, *config.ignore):
        if selector != "ALL" and not any(r.code.startswith(selector) for r in rules):
            known = ", ".join(r.code for r in rules)
            raise ConfigError(f"unknown rule code or prefix {selector!r}; known rules: {known}")
    return [r for r in rules if _specificity(r, select) > _specificity(r, config.ignore)]


def rule_options(rule: Rule, config: Config) -> dict[str, Any]:
    """A rule's thresholds: its defaults updated by configuration, each checked by name and
    type (an int may stand for a float; nothing else changes type)."""
    options = dict(rule.defaults)
    for ref in (rule.code, rule.name):
        for key, value in config.rules.get(ref, {}).items():
            if key not in rule.defaults:
                known = ", ".join(sorted(rule.defaults)) or "none"
                raise ConfigError(
                    f"{rule.code} ({rule.name}) has no option {key!r}; its options: {known}"
                )
            options[key] = _checked(rule, key, value)
    return options


def check_rule_refs(rules: Sequence[Rule], config: Config) -> None:
    """Every `[rules.X]` table and `--option X.k=v` must name a known rule code or name."""
    known = {r.code for r in rules} | {r.name for r in rules}
    for ref in config.rules:
        if ref not in known:
            codes = ", ".join(r.code for r in rules)
            raise ConfigError(f"options given for unknown rule {ref!r}; known rules: {codes}")


def _specificity(rule: Rule, selectors: Iterable[str]) -> int:
    """Length of the longest selector matching `rule` (ALL = 0), or -1 when none does."""
    best = -1
    for selector in selectors:
        if selector == "ALL":
            best = max(best, 0)
        elif rule.code.startswith(selector):
            best = max(best, len(selector))
    return best


def _codes(value: Any, key: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key!r}{where} must be an array of rule codes or prefixes")
    return tuple(v.strip().upper() if v.strip().upper() != "ALL" else "ALL" for v in value)


# An option's type as TOML (and JSON) name it: no "float" or "NoneType" in a message.
_TYPES = {
    bool: "a boolean (true or false)",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    tuple: "an array",
}


def _checked(rule: Rule, key: str, value: Any) -> Any:
    default = rule.defaults[key]
    if isinstance(default, bool) or default is None:
        ok = default is None or isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, (list, tuple)):
        ok = isinstance(value, (list, tuple))
        value = type(default)(value) if ok else value
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise ConfigError(
            f"{rule.code}.{key} must be {_TYPES.get(type(default), 'a string')} "
            f"(default {default!r}), "
            f"not {value!r}"
        )
    return value


def _has_traceq_table(pyproject: Path) -> bool:
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    return "traceq" in data.get("tool", {})
