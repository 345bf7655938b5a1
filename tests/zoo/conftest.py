"""Shared set-up of the zoo tests: where Triton runs, one thread, the zoo discovered once.

Without a GPU the Triton kernels run in the interpreter and the tests use the CPU. On a
GPU machine they run compiled, and the same tests run on ``cuda`` (the ``device``
fixture), so a GPU run checks the real kernels. TRITON_INTERPRET is read when
``@triton.jit`` runs, so it is decided here, before any test module imports a zoo kernel.
One thread keeps CPU timings and CI (2 cores) stable.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # importing torch imports no Triton kernel

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[2]

import importlib  # noqa: E402

import pytest  # noqa: E402
from traceq.zoo.registry import Zoo, discover  # noqa: E402
from traceq.zoo.triton_support import INTERPRETED  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def device() -> str:
    """Where the Triton entries run compiled: ``cuda`` on a GPU machine, else the CPU
    (interpreted)."""
    return "cpu" if INTERPRETED else "cuda"


@pytest.fixture(scope="session")
def builtin_zoo() -> Zoo:
    found = discover()
    assert not found.problems, found.problems
    return found


PluginInstaller = Callable[[str, str], Path]


@pytest.fixture
def install_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PluginInstaller]:
    """Make a throwaway package visible to importlib.metadata, as pip would install it.

    ``install_plugin(module_name, source)`` writes ``module_name.py`` and a
    ``<module_name>-0.1.dist-info`` (METADATA + entry_points.txt registering
    ``module_name:ENTRIES`` in ``traceq.zoo``) into a fresh directory put on sys.path.
    Everything is removed again after the test.
    """
    installed: list[str] = []

    def install(module_name: str, source: str) -> Path:
        root = tmp_path / f"site-{module_name}"
        root.mkdir()
        (root / f"{module_name}.py").write_text(textwrap.dedent(source))
        dist_info = root / f"{module_name}-0.1.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {module_name}\nVersion: 0.1\n"
        )
        (dist_info / "entry_points.txt").write_text(
            f"[traceq.zoo]\n{module_name} = {module_name}:ENTRIES\n"
        )
        (dist_info / "RECORD").write_text("")
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()
        installed.append(module_name)
        return root

    yield install
    for name in installed:
        sys.modules.pop(name, None)
    importlib.invalidate_caches()
