"""Build a large benchmark trace by replicating a real one N times along the time axis.

Each copy is shifted past the end of the previous one, and its correlation ids, external ids,
flow ids and step numbers are offset, so the result is a valid trace N times as long
(links stay one-to-one) rather than N overlapping copies.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

ID_ARGS = ("correlation", "External id", "external id", "Sequence number", "Ev Idx")


def replicate(trace: dict, copies: int) -> dict:
    events = trace["traceEvents"]
    timed = [e for e in events if isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M"]
    start = min(e["ts"] for e in timed)
    end = max(e["ts"] + e.get("dur", 0) for e in timed)
    span = int(end - start) + 1000
    id_offset = 10 ** (len(str(len(events))) + 2)
    out = [e for e in events if e.get("ph") == "M"]
    for k in range(copies):
        for e in events:
            if e.get("ph") == "M":
                continue
            c = dict(e)
            if isinstance(c.get("ts"), (int, float)):
                c["ts"] = c["ts"] + k * span
            if "id" in c and isinstance(c["id"], int):
                c["id"] = c["id"] + k * id_offset
            args = c.get("args")
            if isinstance(args, dict) and k:
                args = dict(args)
                for key in ID_ARGS:
                    if isinstance(args.get(key), int) and args[key] >= 0:
                        args[key] = args[key] + k * id_offset
                c["args"] = args
            if k and c.get("name", "").startswith("ProfilerStep#"):
                c["name"] = f"ProfilerStep#{int(c['name'].split('#')[1]) + k * 1000}"
            out.append(c)
    return {**trace, "traceEvents": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("source", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--copies", type=int, default=10)
    args = parser.parse_args()
    opener = gzip.open if args.source.suffix == ".gz" else open
    with opener(args.source, "rt") as f:
        trace = json.load(f)
    big = replicate(trace, args.copies)
    out_open = gzip.open if args.output.suffix == ".gz" else open
    with out_open(args.output, "wt") as f:
        json.dump(big, f, indent=1)
    print(f"{args.output}: {len(big['traceEvents'])} events")


if __name__ == "__main__":
    main()
