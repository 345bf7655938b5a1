"""The wheel: one top-level package, `traceq`; `cli/` and `zoo/` install as traceq.cli/.zoo.

A wheel that drops `cli` and `zoo` into site-packages shadows anyone's modules of those
names (`import cli` found traceq's). The wheel is built from this checkout and installed
into a fresh folder, and imports are tried from a directory outside the repository, so the
checkout's own folders cannot answer them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE_DIR = {"traceq.cli": "cli", "traceq.zoo": "zoo"}


def _declared() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == PACKAGE_DIR
    return config["packages"]


def _on_disk() -> set[str]:
    names = set()
    for top, package in (("traceq", "traceq"), ("cli", "traceq.cli"), ("zoo", "traceq.zoo")):
        for init in (REPO / top).rglob("__init__.py"):
            parts = init.parent.relative_to(REPO / top).parts
            names.add(".".join((package, *parts)))
    return names


def test_every_package_folder_is_declared() -> None:
    assert set(_declared()) == _on_disk()


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args, "--no-deps"], check=True)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # setuptools builds in the source tree's build/; leave the checkout as it was found.
    had_build = (REPO / "build").exists()
    try:
        _pip("wheel", "--no-build-isolation", "-w", str(out), str(REPO))
    finally:
        if not had_build:
            shutil.rmtree(REPO / "build", ignore_errors=True)
    (built,) = out.glob("traceq-*.whl")
    return built


def test_wheel_has_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"traceq"}
    for path in ("traceq/cli/main.py", "traceq/zoo/registry.py", "traceq/zoo/glu/triton.py"):
        assert path in names


def test_wheel_entry_points_name_traceq_modules(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    (entry_points,) = [n for n in archive.namelist() if n.endswith("entry_points.txt")]
    text = archive.read(entry_points).decode()
    assert "traceq = traceq.cli.main:main" in text
    assert "builtin = traceq.zoo.builtin:ENTRIES" in text


def test_installed_wheel_imports_traceq_cli_not_cli(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    _pip("install", "--target", str(target), str(wheel))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def runs(code: str) -> bool:
        # -I: no PYTHONPATH, no current directory; the installed copy goes first on the path.
        code = f"import sys; sys.path.insert(0, {str(target)!r}); {code}"
        result = subprocess.run(
            [sys.executable, "-I", "-c", code], cwd=elsewhere, capture_output=True
        )
        return result.returncode == 0

    assert not runs("import cli")
    assert not runs("import zoo")
    # Dependencies (polars, ...) live in this interpreter's site-packages, which -I keeps.
    assert runs("import traceq.cli.main, traceq.zoo.registry; import traceq")
    assert runs(
        "import traceq.cli.main as m, sys; "
        f"assert m.__file__.startswith({str(target)!r}), m.__file__; "
        "sys.exit(1 if {'torch', 'triton'} & set(sys.modules) else 0)"
    )
