"""Lab regimes: task settings where token credit may (or may not) be the bottleneck (docs/lab.md, "Regimes").

A regime is a set of :class:`oar.lab.task.TaskConfig` overrides applied to the warm start's task (the RL
problems use the same task without slips), and optionally the run settings of the study that defined it.
``default`` and ``terse`` are the control regimes of the first study; ``long``, ``distract`` and ``verbose`` are
the regime study's; ``chain10`` is the headroom scan's; ``long-b16`` is the scan's confirmed cell, the one regime
where perfect credit pays per update (docs/studies/headroom; the gap closes late in a longer run):
``long``'s task with its batch shape, learning rate, budget and evaluation, so ``oar compare --regime long-b16``
reproduces the cell's runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from oar.lab.run import RunConfig
from oar.lab.task import TaskConfig
from oar.lab.warmstart import WarmStartConfig

LONG = {"min_steps": 6, "max_steps": 8}  # one slipped step among many right ones (slip-rate warm start)


@dataclass(frozen=True)
class Regime:
    """A lab regime. ``task``: TaskConfig overrides. ``recipe``: RunConfig overrides of the training recipe
    (batch shape, learning rate), applied in every preset. ``protocol``: RunConfig overrides of the study's
    measurement (``budget_s``, ``eval_every``, ``eval_problems``, ``eval_k``), applied in every preset but
    ``--quick``, which keeps its smoke size."""

    task: dict = field(default_factory=dict)
    recipe: dict = field(default_factory=dict)
    protocol: dict = field(default_factory=dict)

    def __post_init__(self) -> None:  # a misspelt field fails when the regime is declared, not when it is run
        for part, cls in (("task", TaskConfig), ("recipe", RunConfig), ("protocol", RunConfig)):
            unknown = sorted(set(getattr(self, part)) - {f.name for f in fields(cls)})
            if unknown:
                raise ValueError(f"regime {part}: {', '.join(map(repr, unknown))} is not a {cls.__name__} field")


REGIMES: dict[str, Regime] = {
    "default": Regime(),  # 2-3 steps, verbosity 1 (the first study)
    "terse": Regime({"verbosity": 0}),  # no filler (the first study's verbosity-0 control)
    "long": Regime(LONG),
    "distract": Regime({"distractors": 1}),  # number-holding commentary the answer never uses
    "verbose": Regime({"verbosity": 3}),  # most tokens are filler
    "chain10": Regime({"min_steps": 8, "max_steps": 10}),  # the headroom scan's longest chains
    # the headroom scan's confirmed cell (docs/studies/headroom; a test keeps it equal to the cell's stored config)
    "long-b16": Regime(LONG, recipe={"prompts_per_step": 4, "group_size": 4, "lr": 1e-4},
                       protocol={"budget_s": 100.0, "eval_every": 25, "eval_problems": 256, "eval_k": 2}),
}


def get_regime(name: str) -> Regime:
    """The regime ``name``; ValueError naming the registered regimes."""
    if name not in REGIMES:
        raise ValueError(f"unknown regime {name!r}; regimes: {', '.join(REGIMES)}")
    return REGIMES[name]


def apply_regime(warm: WarmStartConfig, name: str) -> WarmStartConfig:
    """``warm`` with the task overrides of regime ``name``; ValueError naming the registered regimes."""
    return replace(warm, task=replace(warm.task, **get_regime(name).task))
