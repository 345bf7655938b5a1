"""`import traceq` asks Polars' allocator to hand freed pages back sooner (see
traceq/__init__.py): set only when Polars is not loaded yet, never over the user's value."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
OURS = f"narenas:{CPUS},dirty_decay_ms:100,muzzy_decay_ms:0"
SHOW = "import os; {pre}import traceq; print(os.environ.get('_RJEM_MALLOC_CONF', ''))"


def _conf(pre: str = "", **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    out = subprocess.run(
        [sys.executable, "-c", SHOW.format(pre=pre)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_import_traceq_returns_pages_sooner() -> None:
    # Polars puts its own defaults first and appends ours: the last value of a key wins
    conf = _conf()
    assert conf.endswith(OURS), conf


@pytest.mark.parametrize("theirs", ["dirty_decay_ms:7", "background_thread:true"])
def test_a_value_the_user_set_is_kept(theirs: str) -> None:
    conf = _conf(_RJEM_MALLOC_CONF=theirs)
    assert conf.endswith(theirs) and OURS not in conf, conf


def test_nothing_is_set_after_polars_loaded() -> None:
    # the allocator read its settings already: changing the variable would only mislead
    assert OURS not in _conf(pre="import polars; ")
