"""The on-disk cache layout, in one place: ``$OAR_CACHE/<kind>`` when ``OAR_CACHE`` is set, else
``~/.cache/oar/<kind>``. Kinds: ``models`` (safetensors conversions of GGUF files), ``lab`` (warm starts, and
``start-eval/``: each warm start's step-0 evaluation, :func:`oar.lab.run.start_eval_path`)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_KINDS = ("models", "lab")


def cache_dir(kind: str) -> Path:
    """The cache directory of ``kind`` (one of :data:`CACHE_KINDS`); not created."""
    if kind not in CACHE_KINDS:
        raise ValueError(f"cache kind must be one of {CACHE_KINDS}, got {kind!r}")
    root = os.environ.get("OAR_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "oar") / kind
