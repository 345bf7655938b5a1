"""`traceq.load_job` in a plain script, with no `if __name__ == "__main__":` guard, maps
its ranks in worker processes once, rather than re-running the script in each worker and
dying there."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

JOB = Path(__file__).parent.parent / "fixtures" / "jobs" / "ddp_gloo_balanced"


def test_a_script_without_a_main_guard_maps_its_job_once(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(
        textwrap.dedent(
            f"""\
            import traceq

            print("script ran")
            job = traceq.load_job({str(JOB)!r}, engine="local", workers=2, cache=False)
            print("steps", job.frames.step_time.height)
            found = traceq.analyze_job(job, select="TQ4")
            print("ranks", sorted(found.frames.ranks["rank"].to_list()))
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("script ran") == 1  # no worker ran the script again
    assert "steps 4" in done.stdout and "ranks [0, 1, 2, 3]" in done.stdout
    assert "Traceback" not in done.stderr and "warning" not in done.stderr


def test_a_guarded_script_is_not_taken_for_a_plain_one(tmp_path: Path) -> None:
    script = tmp_path / "guarded.py"
    script.write_text(
        textwrap.dedent(
            """\
            from traceq.job.engine import unguarded_script

            print("top", unguarded_script())
            if __name__ == "__main__":
                print("guarded", unguarded_script())
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert f"top {script}" in done.stdout
    assert "guarded None" in done.stdout
