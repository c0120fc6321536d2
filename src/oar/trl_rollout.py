"""The TRL rollout as the credit methods read it: the rewards of one rollout batch (:class:`RolloutRewards`, kept
from TRL's ``_calculate_rewards``) and, for ``vine``, continuations sampled from the policy with ``generate`` and
graded by the trainer's reward functions, called the way TRL calls them
(:class:`oar.credit.peers.vine.Continuations`). Both weigh the reward functions with :func:`reward_total`."""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
from dataclasses import dataclass
from typing import Any

import torch

from oar.credit.peers.vine import RowView


def reward_total(per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``[N]`` TRL's total reward from the rewards per function ``[N, F]`` (NaN where a function gave None):
    the ``reward_weights`` (``[F]``) weighted sum, NaN-skipping, so 0 where no function scored (what TRL trains
    on)."""
    return (per_func * weights.to(per_func.device)[None, :]).nansum(dim=1)


@dataclass(frozen=True)
class RolloutRewards:
    """The rewards of one rollout batch as TRL computed them: ``per_func`` ``[N, F]`` float32 on CPU, every
    process's completions in rank order (NaN where a function gave None), and the ``reward_weights`` ``[F]``."""

    per_func: torch.Tensor
    weights: torch.Tensor

    def local(self, rank: int, n: int) -> RolloutRewards:
        """Process ``rank``'s ``n`` completions (TRL gives every process an equal share, in rank order)."""
        if self.per_func.shape[0] < (rank + 1) * n:
            raise RuntimeError(f"oar: rewards of {self.per_func.shape[0]} completions, expected at least "
                               f"{(rank + 1) * n} (process {rank}, {n} each)")
        return RolloutRewards(self.per_func[rank * n : (rank + 1) * n], self.weights)

    def total(self) -> torch.Tensor:
        """``[N]`` TRL's total reward (:func:`reward_total`); NaN where no reward function scored the completion."""
        return reward_total(self.per_func, self.weights).masked_fill(self.per_func.isnan().all(dim=1), float("nan"))

    def nonfinite(self) -> torch.Tensor:
        """``[N]`` bool: a reward is inf, or every function gave NaN (TRL zeroes such a completion's advantage)."""
        return self.per_func.isinf().any(dim=1) | self.per_func.isnan().all(dim=1)


class TRLContinuations:
    """Samples with ``policy.generate`` (TRL's generation config: sampling, top-k/top-p, EOS, pad; each prefix's KV
    cache computed once for its K samples) and grades with ``trainer.reward_funcs`` weighted by ``reward_weights``
    (the NaN-summing total TRL trains on). ``inputs``: the rollout batch's dataset rows (one per completion).
    Counts what it costs (``cost``: states, generated tokens, graded completions)."""

    def __init__(self, trainer: Any, inputs: list[dict[str, Any]], policy: Any) -> None:
        self.trainer, self.inputs, self.policy = trainer, inputs, policy
        self.tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        self.max_length = trainer.max_completion_length
        self.cost = {"states": 0, "tokens": 0, "graded": 0, "steps": 0, "rows": 0}

    def decode(self, ids: list[list[int]]) -> list[str]:
        return self.tokenizer.batch_decode(ids, skip_special_tokens=True)

    def keys(self) -> torch.Tensor:
        seen: dict[str, int] = {}
        keys = [seen.setdefault(json.dumps(row, sort_keys=True, default=str), len(seen)) for row in self.inputs]
        return torch.tensor(keys, dtype=torch.long)

    def rows(self, idx: torch.Tensor) -> RowView:
        return RowView(self, idx)

    def note_cost(self, **cost: int) -> None:
        for k, v in cost.items():
            self.cost[k] = self.cost.get(k, 0) + v

    @torch.no_grad()
    def sample(self, prefix_ids: torch.Tensor, prefix_mask: torch.Tensor, prefix_lengths: torch.Tensor,
               num_samples: int, temperature: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``[N·K, L]`` continuations (EOS kept; capped at ``max_completion_length - prefix_lengths``) and mask."""
        t = self.trainer
        if any(isinstance(f, torch.nn.Module) for f in t.reward_funcs):
            raise ValueError("credit 'vine' grades continuations with callable reward functions only; a reward model "
                             f"is not supported (reward_funcs: {t.reward_func_names})")
        device = prefix_ids.device
        budget = (self.max_length - prefix_lengths).clamp_min(0).repeat_interleave(num_samples)  # [N·K]
        n_new = int(budget.max()) if budget.numel() else 0
        if n_new == 0:
            empty = torch.zeros(budget.numel(), 0, dtype=torch.long, device=device)
            return empty, empty
        cfg = copy.deepcopy(getattr(t, "generation_config", None))
        if cfg is None:  # vLLM / paged generation in TRL: the same sampling settings for HF generate
            from transformers import GenerationConfig

            cfg = GenerationConfig(do_sample=True, temperature=t.temperature, top_p=t.top_p, top_k=t.top_k,
                                   min_p=t.min_p, repetition_penalty=t.repetition_penalty,
                                   pad_token_id=self.tokenizer.pad_token_id, eos_token_id=t.eos_token_ids)
        cfg.max_new_tokens = n_new
        if temperature is not None:
            cfg.temperature = temperature
        policy = self.policy
        ac = "activation" if hasattr(policy, "is_activation_checkpointing") else "gradient"  # transformers 5 name
        checkpointing = getattr(policy, f"is_{ac}_checkpointing", False)
        if checkpointing:  # as TRL's unwrap_model_for_generation: a checkpointed model generates without a cache
            getattr(policy, f"{ac}_checkpointing_disable")()
        try:
            out = policy.generate(input_ids=prefix_ids.repeat_interleave(num_samples, 0),
                                  attention_mask=prefix_mask.repeat_interleave(num_samples, 0),
                                  past_key_values=self._shared_prefill(prefix_ids, prefix_mask, num_samples, cfg),
                                  generation_config=cfg, synced_gpus=False)  # ranks generate different amounts
        finally:
            if checkpointing:
                getattr(policy, f"{ac}_checkpointing_enable")(
                    **{f"{ac}_checkpointing_kwargs": t.args.gradient_checkpointing_kwargs})
        cont = out[:, prefix_ids.shape[1] :]
        pos = torch.arange(cont.shape[1], device=device)[None, :]
        is_eos = torch.isin(cont, torch.tensor(t.eos_token_ids, device=device))
        first_eos = torch.where(is_eos, pos, cont.shape[1]).amin(dim=1, keepdim=True)
        mask = (pos <= first_eos) & (pos < budget[:, None].to(device))
        return cont.masked_fill(~mask, self.tokenizer.pad_token_id or 0), mask.long()

    def _shared_prefill(self, ids: torch.Tensor, mask: torch.Tensor, k: int, cfg: Any) -> Any:
        """The KV cache of each prefix but its last token, computed once and repeated for its ``k`` samples
        (``generate`` then runs only the last token and the new ones); None where it does not pay or apply."""
        if k < 2 or ids.shape[1] < 2 or getattr(cfg, "cache_implementation", None) not in (None, "dynamic"):
            return None
        from transformers import DynamicCache

        cache = DynamicCache()
        pos = (mask.cumsum(1) - 1).clamp_min(0)
        self.policy(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=pos[:, :-1],
                    past_key_values=cache, use_cache=True)
        cache.batch_repeat_interleave(k)
        return cache

    def reward(self, rows: torch.Tensor, completion_ids: list[list[int]]) -> torch.Tensor:
        """``[M]`` TRL's total reward of each completion, with its row's prompt and dataset columns."""
        from trl.data_utils import is_conversational

        t = self.trainer
        examples = [self.inputs[r] for r in rows.tolist()]
        prompts = [x["prompt"] for x in examples]
        texts = self.decode(completion_ids)
        completions: list[Any] = texts
        if examples and is_conversational(examples[0]):
            completions = [[{"role": "assistant", "content": c}] for c in texts]
        keys = [k for k in examples[0] if k not in ("prompt", "completion", "completion_ids")] if examples else []
        kwargs = {k: [x[k] for x in examples] for k in keys}
        kwargs.update(trainer_state=t.state, log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None)
        per_func = torch.full((len(texts), len(t.reward_funcs)), float("nan"))
        for j, func in enumerate(t.reward_funcs):
            out = func(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs)
            if inspect.isawaitable(out):
                out = asyncio.run(out)
            per_func[:, j] = torch.tensor([float("nan") if r is None else float(r) for r in out])
        return reward_total(per_func, t.reward_weights.cpu())
