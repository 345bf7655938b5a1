"""Stage 2, relations: frames → how events relate.

Launch links and op nesting (`link`, `nesting`), inferred and exact data flow (`dataflow`,
`matching`, `opshapes`, `execution_trace`), the dependency graph (`graph`) and its critical
path (`critical_path`). Rules and reports read these; nothing here imports them.
"""
