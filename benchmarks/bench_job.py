"""Multi-rank jobs: traceq's map/reduce against Holistic Trace Analysis on the same folder.

One run builds jobs of N ranks from one real rank trace (default: HTA's `nccl_parser_config`
rank, an A100 DDP rank with 21 NCCL collectives and full `record_param_comms` arguments):
every rank's clock is skewed by `rank × --skew-us`, and one rank (`--slow-rank`) arrives
`--delay-us` late at every NCCL collective (its kernels start later and end with the
others'), so the others wait for it. Each tool then runs in a fresh process:

- traceq: `load_job(dir)` + `analyze_job(job, select=["TQ401"])`: per-rank map (load,
  step breakdown, collectives) on the default local engine, the reduce (matching, clock
  alignment, waits) and the straggler rule;
- HTA: `TraceAnalysis(trace_dir=dir)` + `get_temporal_breakdown()` +
  `get_potential_stragglers()`.

Reported per (tool, ranks): wall seconds, the driver's peak RSS, the largest peak RSS of
any child process (a pool worker), and what each found as the straggler.

    python benchmarks/bench_job.py [--ranks 16 64] [--json out.json] [--skip-hta]

The machine the numbers in README come from is shared with other work: compare ratios
within one run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SOURCE = REPO.parent / "shared/traces/hta/tests/data/nccl_parser_config/nccl_data.json.gz"
CACHE = HERE / ".cache" / "jobs"
HTA_PYTHON = os.environ.get("HTA_PYTHON", str(REPO.parent / "venv-hta" / "bin" / "python"))
NCCL = ("ncclKernel_", "ncclDevKernel_")


def make_job(source: Path, ranks: int, out: Path, slow_rank: int, delay_us: float, skew_us: float):
    """`ranks` copies of `source` as rank-<r>.json.gz under `out` (skipped when present).
    The stamp that says how they were made lies beside the folder, not in it: a job folder
    holds only its traces (a stray `made.json` in it was listed, and failed, as a rank)."""
    stamp = out.parent / f"{out.name}.made.json"
    spec = {"source": str(source), "ranks": ranks, "slow": slow_rank, "delay_us": delay_us,
            "skew_us": skew_us}  # fmt: skip
    (out / "made.json").unlink(missing_ok=True)  # where older runs left the stamp
    if stamp.exists() and json.loads(stamp.read_text()) == spec:
        return
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(source) as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    base_ts = [e.get("ts") for e in events]
    base_dur = [e.get("dur") for e in events]
    for rank in range(ranks):
        doc["distributedInfo"] = dict(doc.get("distributedInfo", {}), rank=rank, world_size=ranks)
        doc["distributedInfo"]["pg_config"] = [
            {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
             "pg_size": ranks, "ranks": list(range(ranks))}
        ]  # fmt: skip
        for e, ts, dur in zip(events, base_ts, base_dur, strict=True):
            if ts is None:
                continue
            e["ts"] = ts + rank * skew_us
            if dur is not None:
                e["dur"] = dur
            name = e.get("name", "")
            if e.get("cat") == "kernel" and name.startswith(NCCL):
                args = e.get("args", {})
                if "Group size" in args:
                    args["Group size"] = ranks
                    args["Process Group Ranks"] = str(list(range(ranks)))
                if rank == slow_rank and dur:
                    late = min(delay_us, 0.8 * dur)
                    e["ts"] += late
                    e["dur"] = dur - late
        with gzip.open(out / f"rank-{rank}.json.gz", "wt", compresslevel=1) as f:
            json.dump(doc, f)
    stamp.write_text(json.dumps(spec))


TRACEQ_CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
import traceq
imported = time.perf_counter() - t0
t0 = time.perf_counter()
job = traceq.load_job(sys.argv[1])
result = traceq.analyze_job(job, select=["TQ401"])
seconds = time.perf_counter() - t0
stragglers = [f.evidence["rank"] for f in result.findings if f.rule == "TQ401"]
breakdown = result.frames.breakdown
print(json.dumps({
    "seconds": seconds, "import_s": imported,
    "driver_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "child_mb": job.worker_peak_rss_mb,
    "map_cpu_s": getattr(job, "map_cpu_s", None),  # None: code from before it was measured
    "failed_ranks": len(job.failed),
    "stragglers": stragglers, "ranks": result.frames.ranks.height,
    "breakdown_rows": breakdown.height, "collective_calls": result.frames.collectives.height,
    "alignment_applied_us": [v / 1e3 for v in result.frames.alignment["applied_ns"].to_list()][:4],
}))
"""

HTA_CHILD = """
import json, resource, sys, time, warnings, logging
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
imported = time.perf_counter() - t0
t0 = time.perf_counter()
analysis = TraceAnalysis(trace_dir=sys.argv[1])
breakdown = analysis.get_temporal_breakdown(visualize=False)
stragglers = analysis.get_potential_stragglers(num_candidates=1)
seconds = time.perf_counter() - t0
print(json.dumps({
    "seconds": seconds, "import_s": imported,
    "driver_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "child_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    "stragglers": [int(r) for r in stragglers], "ranks": len(analysis.t.traces),
    "breakdown_rows": len(breakdown),
}))
"""


def run_child(python: str, code: str, folder: Path) -> dict:
    # Cold loads on both sides: HTA has no cache, so traceq's columnar cache stays off.
    env = {**os.environ, "TRACEQ_CACHE": "0"}
    proc = subprocess.run(
        [python, "-c", code, str(folder)], capture_output=True, text=True, timeout=3600, env=env
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": " | ".join(tail)}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=SOURCE)
    parser.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--slow-rank", type=int, default=5)
    parser.add_argument("--delay-us", type=float, default=5000.0)
    parser.add_argument("--skew-us", type=float, default=37.0)
    parser.add_argument("--skip-hta", action="store_true")
    parser.add_argument("--hta-python", default=HTA_PYTHON)
    parser.add_argument(
        "--json",
        type=Path,
        default=Path(__file__).parent / "results" / "bench_job.json",
        help="where the result goes (default: the committed latest, results/bench_job.json)",
    )
    args = parser.parse_args(argv)
    if not args.source.exists():
        print(f"bench_job: error: {args.source} is not here (../shared/traces)", file=sys.stderr)
        return 2
    rows = []
    for n in args.ranks:
        folder = CACHE / f"{args.source.name.split('.')[0]}-{n}"
        start = time.perf_counter()
        make_job(args.source, n, folder, args.slow_rank, args.delay_us, args.skew_us)
        print(f"job of {n} ranks ready in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        tools = [("traceq", sys.executable, TRACEQ_CHILD)]
        if not args.skip_hta:
            tools.append(("HTA", args.hta_python, HTA_CHILD))
        for tool, python, code in tools:
            result = {"tool": tool, "ranks_in_job": n, **run_child(python, code, folder)}
            print(json.dumps(result), file=sys.stderr)
            rows.append(result)
    print("| tool | ranks | seconds | driver peak MB | largest worker peak MB | straggler found |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['tool']} | {r['ranks_in_job']} | error: {r['error']} | | | |")
            continue
        print(
            f"| {r['tool']} | {r['ranks_in_job']} | {r['seconds']:.1f} | {r['driver_mb']:,.0f} | "
            f"{r['child_mb']:,.0f} | {r['stragglers']} |"
        )
    facts = {
        "machine": {"cpus": os.cpu_count(), "load_avg": os.getloadavg(), "shared": True},
        "maxrss_self_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "args": {k: str(v) for k, v in vars(args).items()},
        "rows": rows,
    }
    if args.json:
        args.json.write_text(json.dumps(facts, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
