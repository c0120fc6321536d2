"""Peak host memory of a block of code on Linux, for the benchmarks and the GPU check's CPU rehearsal (internal)."""

from __future__ import annotations


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


class PeakMemory:
    """Peak host memory (MiB) above the level at ``start()``, from Linux's VmHWM (reset via clear_refs).

    Run under ``MALLOC_MMAP_THRESHOLD_=65536`` so freed tensors go back to the OS and RSS follows the
    live tensors (the benchmarks set it for their subprocesses).
    """

    def start(self) -> None:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        self.base = _status_kib("VmRSS")

    def peak_mib(self) -> float:
        return (_status_kib("VmHWM") - self.base) / 1024
