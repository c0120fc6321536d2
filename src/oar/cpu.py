"""What this CPU computes fast, the one place ``oar`` asks: whether bf16 matmuls run at hardware speed.

oneDNN runs bf16 matmuls natively on AVX512-BF16 or AMX cores (8x fp32's throughput on the cores measured in
docs/results/lm_step.md); elsewhere (AVX2-only) torch emulates them, about 50x slower than fp32. ``oar train``'s CPU
defaults (:func:`oar.train_run.cpu_defaults`) and the LM lab's numerics (:class:`oar.lab.lm.LMWarmStartConfig`)
read this.
"""

from __future__ import annotations

import functools


@functools.cache
def fast_bf16() -> bool:
    """True when torch's oneDNN back-end runs bf16 matmuls natively on this CPU (AVX512-BF16 or AMX)."""
    import torch

    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
