"""A Megatron text tokenizer read from a Hugging Face ``tokenizer.json`` by the ``tokenizers`` library.

Every tokenizer on the Hub that has a fast version ships a ``tokenizer.json``; reading it needs
``tokenizers`` (a dependency of ours), not transformers. :class:`TokenizerJson` offers what
Megatron's ``MegatronTokenizerText`` asks of its library object (the ``patches.hf.tokenizer_json``
feature builds it there) and ``encode_batch`` for ``tools/preprocess_data.py``.

Special tokens follow what transformers would report: ``eos_token``, ``pad_token``,
``bos_token``, ``unk_token`` from ``tokenizer_config.json`` beside the file; without one, the
end-of-document token is the first of the well-known names that the file marks special.
Megatron's ``eod`` is the eos token, as in upstream's wrapper. ``vocab_size`` counts added
tokens, like ``len(AutoTokenizer)``; padding is left to Megatron.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
# Checked in order when no tokenizer_config.json names the eos token.
EOD_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>", "<|im_end|>", "[SEP]")
SPECIAL_ROLES = ("bos", "eos", "pad", "unk", "sep", "cls", "mask")


def find_tokenizer_json(path) -> Optional[Path]:
    """The ``tokenizer.json`` that ``path`` names (the file itself or one in the directory)."""
    if path is None:
        return None
    p = Path(path)
    if p.is_file() and p.suffix == ".json":
        return p
    if p.is_dir() and (p / TOKENIZER_FILE).is_file():
        return p / TOKENIZER_FILE
    return None


def _token_text(value) -> Optional[str]:
    """tokenizer_config.json writes a token as a string or as {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def read_special_tokens(tokenizer_json: Path, tokenizer) -> dict:
    """Role -> token text, from tokenizer_config.json when present, else from the file's special tokens."""
    roles: dict = {}
    config_path = tokenizer_json.parent / CONFIG_FILE
    if config_path.is_file():
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
        for role in SPECIAL_ROLES:
            token = _token_text(config.get(f"{role}_token"))
            if token is not None:
                roles[role] = token
        if isinstance(config.get("chat_template"), str):
            roles["chat_template"] = config["chat_template"]
    if "eos" not in roles:
        specials = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
        for candidate in EOD_CANDIDATES:
            if candidate in specials:
                roles["eos"] = candidate
                break
        else:
            if len(specials) == 1:
                roles["eos"] = next(iter(specials))
    return roles


class TokenizerJson:
    """Megatron's text-tokenizer interface over a ``tokenizers.Tokenizer``.

    Implements what ``MegatronTokenizerText`` forwards to its library object
    (``text_to_ids``, ``ids_to_text``, ``eod``, ``pad_id``, ``vocab_size``,
    ...), plus :meth:`encode_batch`, which tools/preprocess_data.py uses for
    the library's batched, multi-threaded encoding.
    """

    def __init__(self, path, additional_special_tokens=None, include_special_tokens: bool = True,
                 chat_template: Optional[str] = None, **_ignored):
        from tokenizers import AddedToken, Tokenizer

        self.path = find_tokenizer_json(path)
        if self.path is None:
            raise FileNotFoundError(f"no {TOKENIZER_FILE} at {path}")
        try:
            self.tokenizer = Tokenizer.from_file(str(self.path))
        except Exception as exc:  # the Rust error text names the problem
            raise ValueError(f"cannot read {self.path}: {exc}") from exc
        self.include_special_tokens = include_special_tokens
        self._additional = list(additional_special_tokens or [])
        if self._additional:
            self.tokenizer.add_special_tokens([AddedToken(t, special=True) for t in self._additional])
        roles = read_special_tokens(self.path, self.tokenizer)
        self.chat_template = chat_template or roles.pop("chat_template", None)
        self._special_ids = {}
        for role in SPECIAL_ROLES:
            token = roles.get(role)
            token_id = self.tokenizer.token_to_id(token) if token is not None else None
            if token is not None and token_id is None:
                raise ValueError(f"{self.path.parent / CONFIG_FILE}: {role}_token {token!r} is not in {self.path}")
            self._special_ids[role] = token_id
        self.space_sensitive = self.text_to_tokens("x y") != self.text_to_tokens("x") + self.text_to_tokens("y")

    # Encoding -----------------------------------------------------------------
    def text_to_ids(self, text: str) -> List[int]:
        return self.tokenizer.encode(text, add_special_tokens=self.include_special_tokens).ids

    def encode_batch(self, texts: List[str]) -> List[List[int]]:
        # encode_batch_fast (tokenizers >= 0.20) skips character offsets: same ids, ~20% faster.
        encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        return [e.ids for e in encode(texts, add_special_tokens=self.include_special_tokens)]

    def text_to_tokens(self, text: str) -> List[str]:
        return self.tokenizer.encode(text, add_special_tokens=False).tokens

    def tokens_to_ids(self, tokens: List[str]) -> List[int]:
        return [self.tokenizer.token_to_id(t) for t in tokens]

    def ids_to_tokens(self, ids: List[int]) -> List[str]:
        return [self.tokenizer.id_to_token(int(i)) for i in ids]

    def ids_to_text(self, ids: List[int], remove_special_tokens: Optional[bool] = None) -> str:
        if remove_special_tokens is None:
            remove_special_tokens = not self.include_special_tokens
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=remove_special_tokens)

    def tokens_to_text(self, tokens: List[str]) -> str:
        return self.ids_to_text(self.tokens_to_ids(tokens), remove_special_tokens=False)

    def add_special_tokens(self, special_tokens) -> int:
        from tokenizers import AddedToken

        if isinstance(special_tokens, dict):
            tokens = list(special_tokens.get("additional_special_tokens", []))
            tokens += [v for k, v in special_tokens.items() if k != "additional_special_tokens"]
        else:
            tokens = list(special_tokens)
        return self.tokenizer.add_special_tokens([AddedToken(t, special=True) for t in tokens])

    def apply_chat_template(self, conversation, chat_template=None, **kwargs):
        raise NotImplementedError(
            "chat templates need transformers' jinja renderer; install transformers and pass "
            "--tokenizer-model a directory without tokenizer.json handling, or render prompts beforehand"
        )

    # Vocabulary ---------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def vocab(self) -> list:
        inverse = self.inv_vocab
        return [inverse.get(i) for i in range(self.vocab_size)]

    @property
    def inv_vocab(self) -> dict:
        return {i: t for t, i in self.tokenizer.get_vocab(with_added_tokens=True).items()}

    @property
    def additional_special_tokens_ids(self) -> list:
        return [self.tokenizer.token_to_id(t) for t in self._additional]

    # Special ids (None when the tokenizer defines no such token) ----------------
    @property
    def eos_id(self):
        return self._special_ids["eos"]

    @property
    def eod(self):
        return self._special_ids["eos"]

    @property
    def bos_id(self):
        return self._special_ids["bos"]

    @property
    def pad_id(self):
        return self._special_ids["pad"]

    @property
    def unk_id(self):
        return self._special_ids["unk"]

    @property
    def sep_id(self):
        return self._special_ids["sep"]

    @property
    def cls_id(self):
        return self._special_ids["cls"]

    @property
    def mask_id(self):
        return self._special_ids["mask"]
