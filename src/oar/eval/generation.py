"""Prompting and batched generation: transformers by default, vLLM when installed and a GPU is present."""

from __future__ import annotations

import importlib.util
from typing import Any

from oar.prompts import PROMPT_TEMPLATE as DEFAULT_PROMPT  # re-exported: the evaluation default is the one template
from oar.prompts import check_template as check_template
from oar.prompts import fill_template


def build_prompt(question: str, tokenizer: Any, template: str = DEFAULT_PROMPT) -> str:
    """The text fed to the model: ``template`` with ``{question}`` filled in (plain replacement, so LaTeX
    braces such as ``\\boxed{}`` need no escaping), in the chat template when the tokenizer has one."""
    user = fill_template(template, question)
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": user}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return user


def vllm_available() -> bool:
    """vLLM is used only when it is importable and CUDA is available."""
    import torch

    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


class HFGenerator:
    """Batched ``model.generate`` with left padding; one call -> ``samples`` completions per prompt."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model, self.tokenizer = model, tokenizer

    def __call__(
        self,
        prompts: list[str],
        *,
        samples: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seed: int,
    ) -> list[list[str]]:
        import torch

        tok = self.tokenizer
        enc = tok(
            prompts,
            return_tensors="pt",
            padding=True,
            padding_side="left",
            add_special_tokens=not getattr(tok, "chat_template", None),  # the chat template adds its own
        ).to(self.model.device)
        sampling = dict(temperature=temperature, top_p=top_p) if temperature > 0 else {}
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = self.model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                num_return_sequences=samples,
                pad_token_id=tok.pad_token_id,
                do_sample=temperature > 0,
                **sampling,
            )
        texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        return [texts[i * samples : (i + 1) * samples] for i in range(len(prompts))]


class VLLMGenerator:
    """The same call on vLLM (GPU only): ``source`` is a hub id or local directory."""

    def __init__(self, source: str, dtype: str = "auto") -> None:
        from vllm import LLM

        self.llm = LLM(model=source, dtype=dtype)

    def __call__(
        self,
        prompts: list[str],
        *,
        samples: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seed: int,
    ) -> list[list[str]]:
        from vllm import SamplingParams

        params = SamplingParams(
            n=samples,
            temperature=temperature,
            top_p=top_p if temperature > 0 else 1.0,
            max_tokens=max_new_tokens,
            seed=seed,
        )
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [[c.text for c in o.outputs] for o in outputs]
