"""Stage 2, relations: frames → how events relate.

The room, in the order a trace goes through it:

- `link`: launch ↔ kernel, op ↔ launch, each event's `ProfilerStep` (`launches`: the
  launch calls' names); `nesting`: which range encloses which;
- `dataflow/`: which op's output another op reads, inferred from shapes and order or
  exact from an Execution Trace (a package: `ops`, `shapes`, `matching`, `inferred`,
  `readers/` one module per idiom, `execution_trace`; its `__init__` says more);
- `autograd`: how the profiler names autograd's nodes, for data flow, the breakdown and
  the rules;
- `graph`: the dependency graph over ops, launches and kernels; `critical_path`: its
  longest path;
- `breakdown`: where each step's time goes; `collectives`: communication per rank and
  matched across ranks; `intervals`: time covered by overlapping intervals; `phases`:
  one-time setup (CUDA-graph capture, compiling) a finding must not land in.

Rules and reports read these; nothing here imports them.
"""
