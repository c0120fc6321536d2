"""Token credit: one registry of methods and one function from a rollout batch to per-token advantages.

A *credit method* turns GRPO's sequence advantages ``A [B]`` into token advantages ``[B, T]`` in two steps:

1. ``score``: a per-token signal ``[B, T]`` (OAR's importance, the policy's entropy, group statistics, ...),
   computed either on outcome probes (``needs_probe``: the scorer signature of :mod:`oar.importance`, mapped
   back to completion positions) or on the completions themselves;
2. ``effect``: the signal -> weights (``combine="multiply"`` or ``"mask"``: ``Â = A · w``), offsets
   (``combine="add"``: ``Â = A + δ``) or the token advantages themselves (``combine="replace"``: ``Â = δ``).

:func:`register_credit` adds a method (what it needs, its cost, its paper, its options); :func:`token_credit`
runs one on a batch and returns a :class:`TokenCredit`. The trainer, ``oar attribute``, ``oar compare`` and
the fidelity benchmark all call :func:`token_credit`, so they agree by construction.

Controls wrap any registered method: ``shuffle:NAME`` permutes the method's per-token effect within each
completion (same distribution, no information about *where*), ``inverted:NAME`` computes it from reversed
score ranks (boosts what the method would suppress).

Pure torch; no framework imports.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch

from oar.reshape import BETA, FLOOR, TAU, bilevel_weights

COMBINES = ("multiply", "mask", "add", "replace")
INVERTS = ("row", "batch", "negate")
CONTROLS = ("shuffle", "inverted")
CONTEXT = ("generator", "active", "batch_size", "batch")  # passed by token_credit to a score/effect that takes them
FLAG_KEYS = ("scored", "no_answer", "too_short", "too_long", "truncated", "nonfinite", "uniform")


@dataclass(frozen=True)
class CreditBatch:
    """What a method may read, in TRL's rollout layout. Every tensor is on one device.

    ``prompt_ids`` / ``prompt_mask``: ``[B, P]`` (any padding side). ``completion_ids`` / ``completion_mask``:
    ``[B, T]`` right-padded. ``advantages``: ``[B]`` sequence advantages. ``rewards``: ``[B]`` scalar rewards.
    ``group``: ``[B]`` long, the rollout group (prompt) of each completion. ``model``: the policy (π_old).
    ``rollout``: what samples continuations and grades them (``vine``: an :class:`oar.peers.vine.Continuations`).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    advantages: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    group: torch.Tensor | None = None
    model: Any = None
    rollout: Any = None

    def rows(self, idx: torch.Tensor) -> CreditBatch:
        """The batch restricted to rows ``idx`` ([n] long)."""
        pick = {k: (v[idx] if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        if self.rollout is not None:
            pick["rollout"] = self.rollout.rows(idx)
        return CreditBatch(**pick)


@dataclass(frozen=True)
class CreditMethod:
    """A registered token-credit method (see :func:`register_credit` for the fields)."""

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
    options: Mapping[str, Any]
    invert: Literal["row", "batch", "negate"] = "row"
    control: str | None = None  # "shuffle" / "inverted" for a wrapped method
    base: str | None = None  # the wrapped method's name

    def check_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The method's defaults updated with ``options``; ValueError naming an undeclared option."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise ValueError(f"credit {self.name!r} has no option(s) {unknown}; its options: "
                             f"{', '.join(self.options) or '(none)'}")
        return {**self.options, **options}


_REGISTRY: dict[str, CreditMethod] = {}


def _params(fn: Callable[..., Any]) -> set[str]:
    return {n for n, p in inspect.signature(fn).parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def register_credit(
    name: str,
    *,
    combine: Literal["multiply", "mask", "add", "replace"],
    needs_policy: bool,
    needs_probe: bool,
    needs_group: bool = False,
    passes: str,
    paper: str,
    summary: str,
    effect: Callable[..., torch.Tensor] | None = None,
    options: Mapping[str, Any] | None = None,
    invert: Literal["row", "batch", "negate"] = "row",
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
    defaults in ``options`` and routed by name to ``score`` and/or ``effect``; each also gets the context it
    names in its signature (``generator``, ``active``, ``batch_size``, ``batch``: the :class:`CreditBatch`).

    Args:
        combine: how the effect meets the sequence advantage (``Â = A · w``, ``Â = A + δ`` or ``Â = δ``).
        needs_policy / needs_probe / needs_group: what the method reads (the policy; an outcome probe;
            the rollout group, i.e. ``CreditBatch.group`` and ``rewards`` over whole groups).
        passes / paper / summary: extra model passes per rollout batch, the citation, what it computes
            per token (the docs' method table reads these).
        invert: how ``inverted:NAME`` reverses the score ranks: within each row (``"row"``), over the batch
            (``"batch"``), or by negation (``"negate"``, for signed scores).
        replace_existing: allow re-registering ``name``.
    """
    if combine not in COMBINES:
        raise ValueError(f"combine must be one of {COMBINES}, got {combine!r}")
    if invert not in INVERTS:
        raise ValueError(f"invert must be one of {INVERTS}, got {invert!r}")
    if not name or ":" in name or name != name.lower():
        raise ValueError(f"credit names are non-empty, lower-case and have no ':', got {name!r}")

    def wrap(score: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        if name in _REGISTRY and not replace_existing:
            raise ValueError(f"credit {name!r} is already registered (pass replace_existing=True)")
        eff = effect or bilevel_effect
        opts = dict(options or {})
        routed = (_params(score) | _params(eff)) - set(CONTEXT)
        stray = sorted(set(opts) - routed)
        if stray:
            raise ValueError(f"credit {name!r} declares options {stray} that neither its score nor its effect takes")
        _REGISTRY[name] = CreditMethod(
            name=name, score=score, effect=eff, combine=combine, needs_policy=needs_policy,
            needs_probe=needs_probe, needs_group=needs_group, passes=passes, paper=paper, summary=summary,
            options=opts, invert=invert,
        )
        return score

    return wrap


def unregister_credit(name: str) -> None:
    """Remove a registered method (tests, user code that registers temporary methods)."""
    _REGISTRY.pop(name, None)


def credit_names() -> tuple[str, ...]:
    """Registered method names, in registration order (controls not included)."""
    return tuple(_REGISTRY)


def get_credit(name: str) -> CreditMethod:
    """The method ``name``, or a control ``shuffle:NAME`` / ``inverted:NAME`` wrapping it.

    ValueError listing the registered names (and the control prefixes) for an unknown name.
    """
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
    if base.name == "grpo":
        raise ValueError(f"{name!r}: 'grpo' has uniform weights, so a {control} control of it is plain GRPO")
    if control == "shuffle":
        return replace(base, name=key, effect=_shuffled(base.effect), control=control, base=base.name)
    return replace(base, name=key, effect=_inverted(base.effect, base.invert), control=control, base=base.name)


def credit_table() -> str:
    """The registered methods as a Markdown table (docs/credits.md holds its output; a test keeps them equal)."""
    head = "| credit | per token | combine | needs | extra passes | options (defaults) | paper |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for m in _REGISTRY.values():
        needs = ", ".join(n for n, f in (("policy", m.needs_policy), ("probe", m.needs_probe),
                                         ("group", m.needs_group)) if f) or "–"
        opts = ", ".join(f"{k}={v!r}" for k, v in m.options.items()) or "–"
        cells = [f"`{m.name}`", m.summary, m.combine, needs, m.passes, opts, m.paper]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


# --- effects ------------------------------------------------------------------------------------------------

def bilevel_effect(scores: torch.Tensor, mask: torch.Tensor, tau: float = TAU, beta: float = BETA,
                   floor: float = FLOOR) -> torch.Tensor:
    """Bi-Level weights of each row's masked scores (OAR_SPEC §4; :func:`oar.reshape.bilevel_weights`)."""
    return bilevel_weights(scores, mask, tau, beta, floor)


def _call(fn: Callable[..., Any], *args: Any, options: Mapping[str, Any], **context: Any) -> Any:
    """``fn(*args, **options it takes)``, plus the ``context`` entries (``generator``, ``active``,
    ``batch_size``) its signature names and the options do not set."""
    names = _params(fn)
    kw = {k: v for k, v in options.items() if k in names}
    kw.update({k: v for k, v in context.items() if k in names and k not in kw})
    return fn(*args, **kw)


def shuffle_within_rows(values: torch.Tensor, mask: torch.Tensor,
                        generator: torch.Generator | None = None) -> torch.Tensor:
    """``values [B, T]`` with the masked entries of each row randomly permuted among themselves (the rest
    unchanged): the same per-row multiset, no information about position."""
    B, T = values.shape
    gen_device = generator.device if generator is not None else values.device
    keys = torch.rand(B, T, generator=generator, device=gen_device).to(values.device)
    source = torch.argsort(keys.masked_fill(~mask, float("inf")), dim=1, stable=True)  # masked, random order
    target = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)  # masked, positional order
    out = values.clone()
    out.scatter_(1, target, values.gather(1, source))
    return out


def reverse_ranks(scores: torch.Tensor, mask: torch.Tensor, scope: str) -> torch.Tensor:
    """Scores whose order is reversed over the masked entries: ``max + min - s`` within each row (``"row"``)
    or over the whole batch (``"batch"``), ``-s`` for ``"negate"``. Unmasked entries keep their value."""
    if scope == "negate":
        return torch.where(mask, -scores, scores)
    dims = {"dim": 1, "keepdim": True} if scope == "row" else {}
    hi = scores.masked_fill(~mask, float("-inf")).amax(**dims)
    lo = scores.masked_fill(~mask, float("inf")).amin(**dims)
    return torch.where(mask, hi + lo - scores, scores)


def _shuffled(effect: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def shuffled(scores: torch.Tensor, mask: torch.Tensor, generator: torch.Generator | None = None,
                 **options: Any) -> torch.Tensor:
        return shuffle_within_rows(_call(effect, scores, mask, options=options, generator=generator), mask,
                                   generator)

    shuffled.__signature__ = _merged_signature(effect)  # type: ignore[attr-defined]
    return shuffled


def _inverted(effect: Callable[..., torch.Tensor], scope: str) -> Callable[..., torch.Tensor]:
    def inverted(scores: torch.Tensor, mask: torch.Tensor, generator: torch.Generator | None = None,
                 **options: Any) -> torch.Tensor:
        return _call(effect, reverse_ranks(scores, mask, scope), mask, options=options, generator=generator)

    inverted.__signature__ = _merged_signature(effect)  # type: ignore[attr-defined]
    return inverted


def _merged_signature(effect: Callable[..., Any]) -> inspect.Signature:
    """The wrapped effect's parameters plus ``generator`` (so options route to the wrapper as to the effect)."""
    params = list(inspect.signature(effect).parameters.values())
    if "generator" not in {p.name for p in params}:
        params.append(inspect.Parameter("generator", inspect.Parameter.KEYWORD_ONLY, default=None))
    return inspect.Signature(params)


# --- running a method ---------------------------------------------------------------------------------------

@dataclass
class TokenCredit:
    """The result of :func:`token_credit`; every tensor is ``[B, T]`` (completion layout) or ``[B]``.

    ``weights``: multiplicative factor on the sequence advantage (1 where the method does not act).
    ``offsets``: added after scaling (0 unless ``combine`` is ``"add"`` or ``"replace"``; for ``"replace"`` the
    weights are 0 where the method acts, so the offsets are the token advantages there).
    ``scores``: the method's raw per-token signal (0 where it does not act). ``mask``: the tokens the method
    acted on (reasoning tokens of valid probes for probe methods, completion tokens otherwise; only rows in
    ``active``). ``answer_mask``: the final-answer statement (probe methods; else all False).
    ``flags``: ``[B]`` bool per :data:`FLAG_KEYS`.
    """

    method: str
    combine: str
    weights: torch.Tensor
    offsets: torch.Tensor
    scores: torch.Tensor
    mask: torch.Tensor
    answer_mask: torch.Tensor
    flags: dict[str, torch.Tensor] = field(default_factory=dict)

    def advantages(self, advantages: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` token advantages ``A[:, None] · weights + offsets`` from sequence advantages ``A [B]``."""
        return advantages[:, None] * self.weights.to(advantages.dtype) + self.offsets.to(advantages.dtype)

    def counts(self) -> dict[str, int]:
        """Rows per flag, plus ``tokens`` (acted-on tokens)."""
        return {**{k: int(v.sum()) for k, v in self.flags.items()}, "tokens": int(self.mask.sum())}


def token_credit(
    method: str | CreditMethod,
    batch: CreditBatch,
    *,
    active: torch.Tensor | None = None,
    probe: Any = None,
    references: Sequence[str] | None = None,
    batch_size: int = 16,
    generator: torch.Generator | None = None,
    options: Mapping[str, Any] | None = None,
) -> TokenCredit:
    """Run a credit method on a rollout batch: probe -> scores -> completion positions -> weights or offsets.

    Args:
        method: a registered name (``"oar-g"``, ``"shuffle:oar-g"``, ...) or a :class:`CreditMethod`.
        batch: the rollout batch; ``batch.model`` is required when the method ``needs_policy``, ``group`` and
            ``rewards`` when it ``needs_group``.
        active: ``[B]`` bool, the rows to score (e.g. non-zero advantage); default all. Inactive rows get
            weight 1 and offset 0; group methods still read them as part of their group.
        probe: an :class:`oar.probe.OutcomeProbe` (required when the method ``needs_probe``).
        references: one reference answer per row, for a probe built with ``answer_source="reference"``.
        batch_size: rows per scorer call (rows are sorted by completion length first, so a call pays little
            padding). ``generator``: the random source of the scorer and of the controls.
        options: method options (see ``get_credit(name).options``); undeclared names are a ValueError.

    Returns:
        A :class:`TokenCredit`; ``credit.advantages(A)`` is what the loss consumes.
    """
    m = get_credit(method) if isinstance(method, str) else method
    opts = m.check_options(options or {})
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ids, cmask = batch.completion_ids, batch.completion_mask.bool()
    B, T = ids.shape
    device = ids.device
    active = torch.ones(B, dtype=torch.bool, device=device) if active is None else active.bool().to(device)
    if active.shape != (B,):
        raise ValueError(f"active must be [B] = [{B}], got {tuple(active.shape)}")
    if m.needs_policy and batch.model is None:
        raise ValueError(f"credit {m.name!r} needs the policy: CreditBatch.model is None")
    if m.needs_probe and probe is None:
        raise ValueError(f"credit {m.name!r} needs an outcome probe (probe=OutcomeProbe(tokenizer))")
    if m.needs_group and (batch.group is None or batch.rewards is None):
        raise ValueError(f"credit {m.name!r} needs the rollout group: CreditBatch.group and .rewards")

    scores = torch.zeros(B, T, dtype=torch.float32, device=device)
    mask = torch.zeros(B, T, dtype=torch.bool, device=device)
    answer = torch.zeros(B, T, dtype=torch.bool, device=device)
    flags = {k: torch.zeros(B, dtype=torch.bool, device=device) for k in FLAG_KEYS}
    flags["scored"] = active.clone()
    rows = active.nonzero().squeeze(1)
    rows = rows[torch.argsort(cmask[rows].sum(dim=1), stable=True)]  # similar lengths share a scorer call
    if m.needs_probe:
        for i in range(0, rows.numel(), batch_size):
            _probe_chunk(m, batch, rows[i : i + batch_size], probe, references, opts, generator, scores, mask,
                         answer, flags)
    elif rows.numel():
        s = _call(m.score, batch, options=opts, generator=generator, active=active,
                  batch_size=batch_size).float()
        mask = active[:, None] & cmask
        scores = torch.where(mask, s, torch.zeros_like(s))
    flags["nonfinite"] = torch.where(mask, ~torch.isfinite(scores), False).any(dim=1)
    weights, offsets = credit_effect(m, scores, mask, options=opts, generator=generator, batch=batch)
    flags["uniform"] = active & (((weights == 1) & (offsets == 0)) | ~mask).all(dim=1)
    return TokenCredit(m.name, m.combine, weights, offsets, scores, mask, answer, flags)


def credit_effect(m: CreditMethod, scores: torch.Tensor, mask: torch.Tensor, *, options: Mapping[str, Any],
                  generator: torch.Generator | None = None,
                  batch: CreditBatch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The method's effect on ``scores [B, T]`` over the masked tokens of the whole batch, as ``(weights,
    offsets)`` ``[B, T]`` float32 (weights 1 and offsets 0 off ``mask``); ``A[:, None] · weights + offsets`` are
    the token advantages. ``options`` are the method's checked options (``m.check_options``)."""
    effect = _call(m.effect, scores, mask, options=options, generator=generator, batch=batch).float()
    if m.combine in ("add", "replace"):
        offsets = torch.where(mask, effect, torch.zeros_like(effect))
        one = 0.0 if m.combine == "replace" else 1.0
        weights = torch.where(mask, torch.full_like(effect, one), torch.ones_like(effect))
    else:
        weights = torch.where(mask, effect, torch.ones_like(effect))
        offsets = torch.zeros_like(effect)
    return weights, offsets


def call_with_options(fn: Callable[..., Any], *args: Any, options: Mapping[str, Any], **context: Any) -> Any:
    """``fn(*args, ...)`` with the ``options`` and ``context`` entries its signature names (how
    :func:`token_credit` calls a method's score and effect)."""
    return _call(fn, *args, options=options, **context)


def _probe_chunk(m: CreditMethod, batch: CreditBatch, idx: torch.Tensor, probe: Any,
                 references: Sequence[str] | None, opts: Mapping[str, Any], generator: Any,
                 scores: torch.Tensor, mask: torch.Tensor, answer: torch.Tensor,
                 flags: dict[str, torch.Tensor]) -> None:
    """Score rows ``idx`` on their outcome probes and write the results into the ``[B, T]`` outputs."""
    refs = [references[i] for i in idx.tolist()] if references is not None else None
    pb = probe.build(batch.prompt_ids[idx], batch.prompt_mask[idx], batch.completion_ids[idx],
                     batch.completion_mask[idx], references=refs)
    if pb.valid.any():
        s = _call(m.score, batch.model, pb.input_ids, pb.attention_mask, pb.reasoning_mask, pb.answer_mask,
                  options=opts, generator=generator).detach()
    else:
        s = torch.zeros(pb.input_ids.shape, device=pb.input_ids.device)
    keep = pb.completion_reasoning_mask & pb.valid[:, None]
    scores[idx] = pb.to_completion(s.float()).masked_fill(~keep, 0.0)
    mask[idx] = keep
    answer[idx] = pb.completion_answer_mask
    for k in ("no_answer", "too_short", "too_long", "truncated"):
        flags[k][idx] = getattr(pb, k)


# the built-in methods register themselves on import
from oar import credit_methods as _builtin  # noqa: E402,F401
