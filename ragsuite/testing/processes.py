"""Child processes in tests and benchmarks, always stopped (see :mod:`ragsuite.processes`, re-exported here
so that tests keep one import for their helpers)."""

from ragsuite.processes import running, stop_process

__all__ = ["running", "stop_process"]
