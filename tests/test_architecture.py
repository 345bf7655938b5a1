"""The pipeline's layers and the no-cycle rule hold: import-linter checks the contracts in
pyproject.toml (`[tool.importlinter]`) on the whole package, `cli` and `zoo` included.

`cli/` and `zoo/` install as `traceq.cli` and `traceq.zoo` but live beside `traceq/` in the
checkout, where import-linter (which reads files, not the installed package) would not see
them; the check runs on a copy of the tree laid out as it installs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")

pytestmark = pytest.mark.skipif(
    not Path(LINT_IMPORTS).exists(), reason="import-linter is not installed (the test extra)"
)


def installed_layout(tmp_path: Path) -> Path:
    """`traceq/` with `cli/` and `zoo/` inside it, as a wheel lays them out."""
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.c")
    shutil.copytree(ROOT / "traceq", tmp_path / "traceq", ignore=skip)
    shutil.copytree(ROOT / "cli", tmp_path / "traceq" / "cli", ignore=skip)
    shutil.copytree(ROOT / "zoo", tmp_path / "traceq" / "zoo", ignore=skip)
    return tmp_path


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [LINT_IMPORTS, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_contracts_are_kept(tmp_path: Path) -> None:
    result = lint_imports(installed_layout(tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in result.stdout


def test_a_stage_reaching_back_breaks_the_layers(tmp_path: Path) -> None:
    tree = installed_layout(tmp_path)
    (tree / "traceq" / "loader" / "reaching_back.py").write_text(
        "from traceq.rules.finding import Finding\n"
    )
    result = lint_imports(tree)
    assert result.returncode == 1
    assert "traceq.loader.reaching_back -> traceq.rules.finding" in result.stdout


def test_an_import_cycle_breaks_the_no_cycle_contract(tmp_path: Path) -> None:
    """Two rules modules that import each other (a function-level import counts too)."""
    tree = installed_layout(tmp_path)
    rules = tree / "traceq" / "rules"
    (rules / "cycle_a.py").write_text("def f():\n    from traceq.rules import cycle_b\n")
    (rules / "cycle_b.py").write_text("from traceq.rules import cycle_a\n")
    result = lint_imports(tree)
    assert result.returncode == 1
    assert "No import cycles inside traceq BROKEN" in result.stdout


def test_every_module_is_in_a_layer(tmp_path: Path) -> None:
    """A new top-level module must be given its place in the layers (`exhaustive`)."""
    tree = installed_layout(tmp_path)
    (tree / "traceq" / "homeless.py").write_text("")
    result = lint_imports(tree)
    assert result.returncode == 1
    assert "traceq.homeless" in result.stdout
