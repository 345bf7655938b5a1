"""Which runtime calls launch GPU work: the names shared by linking, the graph and `Trace`.

A module of its own so that `Trace` (and a cached `traceq info`) can ask it without
importing the linking code and numpy with it.
"""

LAUNCH_API = (
    r"(?i)^(cuda|cu|hip|hipExt)(LaunchKernel|LaunchCooperativeKernel|LaunchKernelExC|"
    r"ModuleLaunchKernel|ExtModuleLaunchKernel|Memcpy\w*Async|Memset\w*Async|GraphLaunch)"
)

GRAPH_LAUNCH = r"(?i)^(cuda|hip)GraphLaunch|^cuGraphLaunch"
"""A CUDA/HIP graph replay: every kernel of the graph shares this call's correlation."""
