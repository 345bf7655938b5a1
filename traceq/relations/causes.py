"""The causes a critical path's time is split into, and how a person reads each.

A module of its own so that what names a cause (`traceq info`'s job table, the CLI) does
not import the critical path's machinery (networkx, scipy) with it.
"""

CAUSES = (
    "cpu_bound",
    "gpu_compute",
    "gpu_communication",
    "launch_overhead",
    "kernel_to_kernel_overhead",
    "sync_wait",
    "idle",
)
CAUSE_LABELS = {
    "cpu_bound": "CPU-bound",
    "gpu_compute": "GPU compute",
    "gpu_communication": "GPU communication",
    "launch_overhead": "launch overhead",
    "kernel_to_kernel_overhead": "kernel-to-kernel overhead",
    "sync_wait": "sync wait",
    "idle": "idle",
}
"""Each cause as a person reads it, for every output that names one."""
