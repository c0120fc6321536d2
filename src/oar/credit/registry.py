"""The registry of token-credit methods: :func:`register_credit` adds one (what it needs, its cost, its paper,
its options and the rules between them), :func:`get_credit` looks one up (or a control wrapping it),
:func:`credit_table` lists them.

A *credit method* turns GRPO's sequence advantages ``A [B]`` into token advantages ``[B, T]`` in two steps:

1. ``score``: a per-token signal ``[B, T]`` (OAR's importance, the policy's entropy, group statistics, ...),
   computed either on outcome probes (``needs_probe``: the scorer signature of :mod:`oar.importance`, mapped
   back to completion positions) or on the completions themselves;
2. ``effect``: the signal -> weights (``combine="multiply"`` or ``"mask"``: ``Â = A · w``), offsets
   (``combine="add"``: ``Â = A + δ``) or the token advantages themselves (``combine="replace"``: ``Â = δ``).

Everything a caller must know about a method is declared here, at registration: what it reads (``needs_*``),
whether it acts at all (``acts``), whether it runs outside the lab (``lab_only``), its options and their rules.
Pure torch; no framework imports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch

from oar.credit.controls import CONTROLS, inverted_effect, shuffled_effect
from oar.credit.options import CONTEXT, Option, OptionCheck, OptionGroup, as_option, parameter_names
from oar.reshape import BETA, FLOOR, RULES, SIGN_EPS, SIGN_ETA, SIGN_TAU, TAU, bilevel_weights, rule_weights
from oar.steps import SEPARATOR, step_ends, step_ids

COMBINES = ("multiply", "mask", "add", "replace")
INVERTS = ("row", "batch", "negate")


@dataclass(frozen=True)
class CreditMethod:
    """A registered token-credit method (see :func:`register_credit` for the fields).

    Pickles as its name (``get_credit(name)`` on load), so a config holding one can be saved wherever the method
    is registered."""

    name: str
    score: Callable[..., torch.Tensor]
    effect: Callable[..., torch.Tensor]
    combine: Literal["multiply", "mask", "add", "replace"]
    needs_policy: bool
    needs_probe: bool
    needs_group: bool
    passes: str
    paper: str
    summary: str
    options: Mapping[str, Any]  # name -> default
    invert: Literal["row", "batch", "negate"] = "row"
    control: str | None = None  # "shuffle" / "inverted" for a wrapped method
    base: str | None = None  # the wrapped method's name
    specs: Mapping[str, Option] = field(default_factory=dict)  # name -> its declaration (type, range, choices)
    needs_rollout: bool = False  # samples continuations: CreditBatch.rollout (vine)
    acts: bool = True  # False: leaves every advantage as it is (plain GRPO); token_credit scores nothing
    lab_only: bool = False  # reads the arithmetic lab's ground truth: trains in the lab only (oar compare)
    checks: tuple[OptionCheck, ...] = ()  # cross-option rules, the groups' then the method's own

    def __reduce__(self) -> tuple[Any, ...]:
        return get_credit, (self.name,)

    def check_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The method's defaults updated with ``options``; ValueError naming an undeclared option, a value its
        declaration refuses (``credit 'oar-g': beta must be >= 0, got -1``) or a combination its rules refuse."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise ValueError(f"credit {self.name!r} has no option(s) {unknown}; its options: "
                             f"{', '.join(self.options) or '(none)'}")
        for key, value in options.items():
            if key in self.specs:
                self.specs[key].check(f"credit {self.name!r}: {key}", value)
        merged = {**self.options, **options}
        for check in self.checks:
            try:
                check(merged)
            except ValueError as err:
                raise ValueError(f"credit {self.name!r}: {err}") from None
        return merged


_REGISTRY: dict[str, CreditMethod] = {}


def _builtins() -> None:
    """Register the built-in methods (:mod:`oar.credit.catalogue`) before the registry is first read or added to,
    so they come first, in the catalogue's order, whatever a user registers."""
    import sys

    if "oar.credit.catalogue" not in sys.modules:  # also while the catalogue itself registers: it is there
        import oar.credit.catalogue  # noqa: F401


def register_credit(
    name: str,
    *,
    combine: Literal["multiply", "mask", "add", "replace"],
    needs_policy: bool,
    needs_probe: bool,
    needs_group: bool = False,
    needs_rollout: bool = False,
    passes: str,
    paper: str,
    summary: str,
    effect: Callable[..., torch.Tensor] | None = None,
    options: Mapping[str, Any | Option] | None = None,
    groups: Sequence[OptionGroup] = (),
    check: OptionCheck | None = None,
    invert: Literal["row", "batch", "negate"] = "row",
    acts: bool = True,
    lab_only: bool = False,
    replace_existing: bool = False,
) -> Callable[[Callable[..., torch.Tensor]], Callable[..., torch.Tensor]]:
    """Decorator registering a score function as the credit method ``name``.

    The score function is called as ``score(model, input_ids, attention_mask, reasoning_mask, answer_mask,
    **options)`` on outcome probes when ``needs_probe`` (the :mod:`oar.importance` scorer signature; scores
    ``[b, L]`` are mapped to completion positions, and the method acts on reasoning tokens only), else as
    ``score(batch: CreditBatch, **options) -> [B, T]`` on the completions (the method acts on every completion
    token). ``effect(scores [B, T], mask [B, T], **options) -> [B, T]`` turns the scores of the whole batch into
    weights (``combine`` ``"multiply"``: e.g. mass-preserving weights, ``"mask"``: 0/1), offsets (``"add"``) or
    token advantages (``"replace"``); default Bi-Level reshaping (OAR_SPEC §4). Options are declared with their
    defaults in ``options`` and ``groups`` and routed by name to ``score`` and/or ``effect``; each also gets the
    context it names in its signature (``generator``, ``active``, ``batch_size``, ``batch``: the
    :class:`CreditBatch`). An option is a plain default (any value accepted) or an
    :class:`oar.credit.options.Option` declaring its type and range, checked whenever options are
    (:meth:`CreditMethod.check_options`: ``OARConfig``, ``oar compare`` columns, the verl config,
    :func:`token_credit`).

    Args:
        combine: how the effect meets the sequence advantage (``Â = A · w``, ``Â = A + δ`` or ``Â = δ``).
        needs_policy / needs_probe / needs_group / needs_rollout: what the method reads (the policy; an outcome
            probe; the rollout group, i.e. ``CreditBatch.group`` and ``rewards`` over whole groups; continuations
            sampled from the policy and graded, ``CreditBatch.rollout``).
        passes / paper / summary: extra model passes per rollout batch, the citation, what it computes
            per token (the docs' method table reads these).
        groups: shared option groups (:class:`oar.credit.options.OptionGroup`, e.g. the Bi-Level options), each
            with its cross-option check. ``check``: the method's own rule between its options, called with every
            option (defaults filled in); a ValueError names what is refused.
        invert: how ``inverted:NAME`` reverses the score ranks: within each row (``"row"``), over the batch
            (``"batch"``), or by negation (``"negate"``, for signed scores).
        acts: False for a method that leaves every advantage as it is (plain GRPO): nothing is scored, and a
            control of it is refused. ``lab_only``: it reads the arithmetic lab's ground truth (``oar train``
            refuses it; ``oar compare`` trains it).
        replace_existing: allow re-registering ``name``.
    """
    if combine not in COMBINES:
        raise ValueError(f"combine must be one of {COMBINES}, got {combine!r}")
    if invert not in INVERTS:
        raise ValueError(f"invert must be one of {INVERTS}, got {invert!r}")
    if not name or ":" in name or "@" in name or name != name.lower() or name != name.strip():
        raise ValueError(f"credit names are non-empty, lower-case and have no ':', '@' or outer spaces, got {name!r}")

    def wrap(score: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        _builtins()
        if name in _REGISTRY and not replace_existing:
            raise ValueError(f"credit {name!r} is already registered (pass replace_existing=True)")
        eff = effect or bilevel_effect
        specs: dict[str, Option] = {}
        for source in (options or {}, *groups):  # the method's own first, then each group's
            twice = sorted(set(specs) & set(source))
            if twice:
                raise ValueError(f"credit {name!r} declares options {twice} twice (in two places: its own, its groups)")
            specs.update({k: as_option(v) for k, v in source.items()})
        routed = (parameter_names(score) | parameter_names(eff)) - set(CONTEXT)
        stray = sorted(set(specs) - routed)
        if stray:
            raise ValueError(f"credit {name!r} declares options {stray} that neither its score nor its effect takes")
        for key, spec in specs.items():  # a declaration must accept its own default
            spec.check(f"credit {name!r}: default of {key}", spec.default)
        checks = tuple(c for c in (*(g.check for g in groups), check) if c is not None)
        method = CreditMethod(
            name=name, score=score, effect=eff, combine=combine, needs_policy=needs_policy,
            needs_probe=needs_probe, needs_group=needs_group, passes=passes, paper=paper, summary=summary,
            options={k: spec.default for k, spec in specs.items()}, invert=invert, specs=specs,
            needs_rollout=needs_rollout, acts=acts, lab_only=lab_only, checks=checks,
        )
        method.check_options({})  # the defaults must pass the rules too
        _REGISTRY[name] = method
        return score

    return wrap


def import_modules(modules: Sequence[str]) -> None:
    """Import each named module (one that registers its own credit methods: ``--import MODULE``).

    ValueError naming the module that cannot be imported (not found, or its own import failed)."""
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ValueError(f"--import {module!r}: cannot import it ({err}); is it on PYTHONPATH?") from None


def unregister_credit(name: str) -> None:
    """Remove a registered method (tests, user code that registers temporary methods)."""
    _builtins()
    _REGISTRY.pop(name, None)


def credit_names() -> tuple[str, ...]:
    """Registered method names, in registration order (controls not included)."""
    _builtins()
    return tuple(_REGISTRY)


def get_credit(name: str) -> CreditMethod:
    """The method ``name``, or a control ``shuffle:NAME`` / ``inverted:NAME`` wrapping it.

    ValueError listing the registered names (and the control prefixes) for an unknown name.
    """
    _builtins()
    if not isinstance(name, str):
        raise ValueError(f"credit must be a string, got {name!r}")
    key = name.strip().lower()
    control, _, base_name = key.rpartition(":")
    if control and control not in CONTROLS:
        raise ValueError(f"unknown credit control {control!r} in {name!r}; controls: {', '.join(CONTROLS)} "
                         f"(as CONTROL:NAME)")
    if base_name not in _REGISTRY:
        raise ValueError(f"unknown credit {name!r}; registered: {', '.join(_REGISTRY)} "
                         f"(controls: {', '.join(c + ':NAME' for c in CONTROLS)})")
    base = _REGISTRY[base_name]
    if not control:
        return base
    if not base.acts:
        raise ValueError(f"{name!r}: {base.name!r} leaves every advantage as it is, so a {control} control of it "
                         f"is {base.name!r} itself")
    if control == "shuffle":
        return replace(base, name=key, effect=shuffled_effect(base.effect), control=control, base=base.name)
    return replace(base, name=key, effect=inverted_effect(base.effect, base.invert), control=control, base=base.name)


def credit_table() -> str:
    """The registered methods as a Markdown table (docs/credits.md holds its output; a test keeps them equal)."""
    _builtins()
    head = "| credit | per token | combine | needs | extra passes | options (defaults) | paper |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for m in _REGISTRY.values():
        needs = ", ".join(n for n, f in (("policy", m.needs_policy), ("probe", m.needs_probe),
                                         ("group", m.needs_group), ("rollout", m.needs_rollout),
                                         ("lab", m.lab_only)) if f) or "–"
        opts = ", ".join(f"{k}={v!r}" for k, v in m.options.items()) or "–"
        cells = [f"`{m.name}`", m.summary, m.combine, needs, m.passes, opts, m.paper]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def rule_table() -> str:
    """The reshaping rules every importance credit takes as ``rule=`` (:data:`oar.reshape.RULES`), as a Markdown
    table (``oar credits`` prints it under the methods; docs/credits.md holds it; a test keeps them equal)."""
    lines = ["| rule | weights | advantage mass | its options | source |", "|---|---|---|---|---|"]
    for name, r in RULES.items():
        cells = [f"`{name}`", r.weights, r.mass, r.options, r.source]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def bilevel_effect(scores: torch.Tensor, mask: torch.Tensor, rule: str = "bilevel", tau: float = TAU,
                   beta: float = BETA, floor: float = FLOOR, sign_tau: float = SIGN_TAU, sign_eta: float = SIGN_ETA,
                   sign_eps: float = SIGN_EPS, separator: str = SEPARATOR,
                   boundary_ids: list[int] | tuple[int, ...] | None = None, batch: Any = None,
                   probe: Any = None) -> torch.Tensor:
    """The importance credits' effect: the weights of ``rule`` on each row's masked scores (default OAR's Bi-Level,
    OAR_SPEC §4; :func:`oar.reshape.rule_weights`). ``sign`` and ``process`` read the sign of
    ``batch.advantages``; ``step`` and ``process`` group the tokens into steps (:mod:`oar.steps`: ``boundary_ids``,
    or ``separator`` resolved by ``batch.tokenizer`` or the probe's tokenizer)."""
    if rule == "bilevel":  # OAR_SPEC §4 as it always was: reads nothing but the scores
        return bilevel_weights(scores, mask, tau, beta, floor)
    steps = None
    if rule in ("step", "process"):
        if batch is None:
            raise ValueError(f"rule {rule!r} needs the completions (a CreditBatch) to find the steps")
        tokenizer = batch.tokenizer if batch.tokenizer is not None else getattr(probe, "tokenizer", None)
        ends = step_ends(separator, boundary_ids, tokenizer, scores.device)
        steps = step_ids(batch.completion_ids.to(scores.device), mask, ends)
    advantages = None if batch is None or batch.advantages is None else batch.advantages.to(scores.device)
    return rule_weights(rule, scores, mask, advantages=advantages, steps=steps, tau=tau, beta=beta, floor=floor,
                        sign_tau=sign_tau, sign_eta=sign_eta, sign_eps=sign_eps)
