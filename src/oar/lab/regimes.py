"""Lab regimes: task settings where token credit may (or may not) be the bottleneck (docs/lab.md, protocol).

Each regime is a set of :class:`oar.lab.task.TaskConfig` overrides applied to the warm start's task (the RL
problems use the same task without slips). ``default`` and ``terse`` are the control regimes of the first
study; ``long``, ``distract`` and ``verbose`` are the regime study's (docs/lab.md: protocol, tuning log, results);
``chain10`` is the headroom scan's (docs/lab.md, "Credit headroom").
"""

from __future__ import annotations

from dataclasses import replace

from oar.lab.warmstart import WarmStartConfig

REGIMES: dict[str, dict] = {
    "default": {},  # 2-3 steps, verbosity 1 (the first study)
    "terse": {"verbosity": 0},  # no filler (the first study's verbosity-0 control)
    "long": {"min_steps": 6, "max_steps": 8},  # one slipped step among many right ones (slip-rate warm start)
    "distract": {"distractors": 1},  # number-holding commentary the answer never uses
    "verbose": {"verbosity": 3},  # most tokens are filler
    "chain10": {"min_steps": 8, "max_steps": 10},  # the headroom scan's longest chains (docs/lab.md, headroom)
}


def apply_regime(warm: WarmStartConfig, name: str) -> WarmStartConfig:
    """``warm`` with the task overrides of regime ``name``; ValueError naming the registered regimes."""
    if name not in REGIMES:
        raise ValueError(f"unknown regime {name!r}; regimes: {', '.join(REGIMES)}")
    return replace(warm, task=replace(warm.task, **REGIMES[name]))
