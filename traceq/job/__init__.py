"""Multi-rank jobs: one trace per rank, mapped per rank and reduced across ranks."""

from traceq.job.job import Job, JobFrames, load_job

__all__ = ["Job", "JobFrames", "load_job"]
