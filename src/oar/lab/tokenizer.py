"""An offline character-level tokenizer (built in milliseconds, no hub access)."""

from __future__ import annotations

import string

PAD, EOS, BOS = "<pad>", "<eos>", "<bos>"
PRINTABLE = string.digits + string.ascii_letters + string.punctuation + " \n"


def build_char_tokenizer(alphabet: str = PRINTABLE, padding_side: str = "left"):
    """A ``PreTrainedTokenizerFast`` with one token per character of ``alphabet``.

    Ids: ``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, then the characters in order (a character outside the
    alphabet encodes as ``<pad>``). Decoding joins characters with no separator.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(dict.fromkeys(alphabet))
    if not chars:
        raise ValueError("alphabet is empty")
    vocab = {PAD: 0, EOS: 1, BOS: 2, **{c: i + 3 for i, c in enumerate(chars)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS, bos_token=BOS)
    tok.padding_side = padding_side
    return tok


def decode_chars(ids: list[int], alphabet: str = PRINTABLE, special: str = "\x00") -> str:
    """The text of lab token ids ``ids``, one character per token (``<pad>``/``<eos>``/``<bos>`` and unknown ids
    become ``special``), so character ``i`` is token ``i``: the inverse of :func:`build_char_tokenizer`'s vocabulary."""
    chars = list(dict.fromkeys(alphabet))
    return "".join(chars[i - 3] if 3 <= i < len(chars) + 3 else special for i in ids)
