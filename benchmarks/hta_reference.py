"""Run Holistic Trace Analysis's critical path on the reference traces and commit its numbers.

HTA (facebookresearch/HolisticTraceAnalysis) is not a traceq dependency: it runs in its
own environment, so this script is run *with that environment's Python*:

    /work/venv-hta/bin/python benchmarks/hta_reference.py            # writes the JSON
    /work/venv-hta/bin/python benchmarks/hta_reference.py --check    # compares, writes nothing

It writes `fixtures/gpu/hta_critical_path.json`: for each case, the trace (repo-relative
for the bundled GPU fixtures, ../shared/traces-relative for the others), its sha256, the
region HTA was asked for, and HTA's result: time per `bound_by` cause (µs), the events on
the path, the time on the path per event, and the graph's node count.
`tests/test_critical_path.py` compares traceq's critical path with these numbers in every
run (the checksum proves the numbers belong to the file), and with a live HTA run as well
where HTA's environment exists. Shared cases are skipped here when ../shared is absent and
their committed numbers are kept.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import logging
import os
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("TRACEQ_SHARED_TRACES", REPO.parent / "shared" / "traces"))
OUT = REPO / "fixtures" / "gpu" / "hta_critical_path.json"
ALEXNET_ANNOTATION = "[param|pytorch.model.alex_net|0|0|0|measure|forward]"
# name -> (where, path, annotation, instance), as HTA's tests/test_critical_path_analysis.py
# asks for them. where: "repo" (bundled, relative to the repo) or "shared".
# Cases in SUMMARY_ONLY keep the breakdown and node count, not the 12k events on the path.
SUMMARY_ONLY = {"df_index_resolver"}
CASES = {
    "alexnet": ("repo", "fixtures/gpu/hta-alexnet-a100.json.gz", ALEXNET_ANNOTATION, 1),
    "alexnet_first": ("repo", "fixtures/gpu/hta-alexnet-a100.json.gz", ALEXNET_ANNOTATION, 0),
    "event_sync": ("repo", "fixtures/gpu/hta-event_sync-a100.json.gz", "ProfilerStep", 0),
    "sampled_rank0": ("repo", "fixtures/gpu/hta-sampled_rank-0.json.gz", "ProfilerStep", 0),
    "simple_add": (
        "shared",
        "hta/tests/data/critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz",
        ALEXNET_ANNOTATION,
        1,
    ),
    "multi_stream": (
        "shared",
        "hta/tests/data/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
        "",
        0,
    ),
    "ns_resolution": (
        "shared",
        "hta/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
        "ProfilerStep",
        1,
    ),
    "df_index_resolver": (
        "shared",
        "hta/tests/data/df_index_resolver/df_index_resolver.json.gz",
        "ProfilerStep",
        0,
    ),
}


def file_of(where: str, path: str) -> Path:
    return (REPO if where == "repo" else SHARED) / path


def run_hta(path: Path, annotation: str, instance: int) -> dict:
    """HTA's critical path of one region, reduced to plain numbers."""
    from hta.configs.config import logger
    from hta.trace_analysis import TraceAnalysis

    logger.setLevel(logging.ERROR)
    analysis = TraceAnalysis(trace_files={0: str(path)}, trace_dir=str(path.parent))
    graph, ok = analysis.critical_path_analysis(
        rank=0, annotation=annotation, instance_id=instance if annotation else None
    )
    frame = graph.get_critical_path_breakdown()
    return {
        "ok": bool(ok),
        "bound_by_us": {
            str(k): int(v) for k, v in frame.groupby("bound_by").duration.sum().items() if k
        },
        "events": sorted(int(e) for e in graph.critical_path_events_set),
        "event_us": {
            str(int(k)): int(v)
            for k, v in frame[frame.duration > 0].groupby("event_idx").duration.sum().items()
        },
        "nodes": graph.number_of_nodes(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed file")
    parser.add_argument("--only", nargs="*", help="case names (default: all)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    old = json.loads(OUT.read_text())["cases"] if OUT.is_file() else {}
    cases = dict(old)
    differ = []
    for name, (where, rel, annotation, instance) in CASES.items():
        if args.only and name not in args.only:
            continue
        path = file_of(where, rel)
        if not path.is_file():
            print(f"skip {name}: {path} is absent (committed numbers kept)", file=sys.stderr)
            continue
        hta = run_hta(path, annotation, instance)
        if name in SUMMARY_ONLY:
            hta = {k: v for k, v in hta.items() if k not in ("events", "event_us")}
        entry = {
            "where": where,
            "path": rel,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "annotation": annotation,
            "instance": instance,
            "hta": hta,
        }
        if old.get(name) != entry:
            differ.append(name)
        cases[name] = entry
        print(f"{name}: {entry['hta']['bound_by_us']}", file=sys.stderr)
    if args.check:
        print("differ from the committed numbers:", differ or "none")
        return 1 if differ else 0
    version = importlib.metadata.version("HolisticTraceAnalysis")
    document = {
        "generator": "benchmarks/hta_reference.py (run with HTA's own environment)",
        "hta_version": version,
        "python": sys.version.split()[0],
        "cases": {name: cases[name] for name in CASES if name in cases},
    }
    OUT.write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")
    print(f"wrote {OUT.relative_to(REPO)} ({len(document['cases'])} cases)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
