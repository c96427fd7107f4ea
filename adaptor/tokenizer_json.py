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

The same ids as upstream, or none. transformers 5 does not always run ``tokenizer.json`` as
written: the ``tokenizer_class`` that tokenizer_config.json names decides. ``PreTrainedTokenizerFast``
and ``TokenizersBackend`` (or no class) run the file as written, and so does ``LlamaTokenizer(Fast)``
over a byte-level file (DeepSeek-V3's, Llama 3's). ``LlamaTokenizer(Fast)`` over a sentencepiece-style
file (Llama 2, Mistral, Yi) and ``Qwen2Tokenizer(Fast)`` rebuild the pipeline from the file's
vocabulary and merges: the model flags, normaliser, pre-tokeniser (for Llama, ``▁`` prepended to the
first word only unless ``legacy: true``, and ``add_prefix_space``) and decoder are the class's own,
and the file's post-processor stays. :func:`transformers_pipeline` builds those same parts and
:class:`TokenizerJson` runs them. Decoding is upstream's ``ids_to_text``: tokens, less the special
tokens tokenizer_config.json names when asked to skip them, through the decoder (no clean-up of
spaces, which that path never applies). What this module cannot reproduce (another class, an
``auto_map``, a rebuilt class over a model it does not rebuild, or an installed transformers
other than 5) is named by :func:`unreproducible`: patches/hf/tokenizer_json.py and
tools/preprocess_data.py then hand the tokenizer to upstream's wrapper when transformers is
installed, and stop with that one line when it is not.
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
# transformers 5 classes that run tokenizer.json as written.
AS_WRITTEN = {"PreTrainedTokenizer", "TokenizersBackend"}  # names without "Fast"
# The transformers major version whose loading rules transformers_pipeline follows.
RULES_MAJOR = 5


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


def read_config(tokenizer_json: Path) -> dict:
    """tokenizer_config.json beside the file, or {}."""
    config_path = tokenizer_json.parent / CONFIG_FILE
    if not config_path.is_file():
        return {}
    with open(config_path, encoding="utf-8") as f:
        return json.load(f)


def _class_name(config: dict) -> Optional[str]:
    name = config.get("tokenizer_class")
    return name[:-len("Fast")] if isinstance(name, str) and name.endswith("Fast") else name


def _byte_level(tokenizer_json: Path) -> bool:
    """transformers' own test for a Llama-declared file that is really byte-level."""
    return '"ByteLevel"' in tokenizer_json.read_text(encoding="utf-8")


def _installed_transformers_major() -> Optional[int]:
    """The installed transformers' major version (from its metadata: nothing is imported), or None."""
    from importlib import metadata

    try:
        return int(metadata.version("transformers").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return None


def unreproducible(path) -> Optional[str]:
    """The tokenizer setting that makes transformers' tokenizer differ from what this module runs,
    in words, or None when :class:`TokenizerJson` gives upstream's ids."""
    tokenizer_json = find_tokenizer_json(path)
    if tokenizer_json is None:
        return None
    config = read_config(tokenizer_json)
    where = f"{tokenizer_json.parent / CONFIG_FILE}"
    if config.get("auto_map"):
        return f"{where}: auto_map (a tokenizer class of the model's own code)"
    name = _class_name(config)
    if name is None or name in AS_WRITTEN:
        return None
    major = _installed_transformers_major()
    if major is not None and major != RULES_MAJOR:
        return (f"{where}: tokenizer_class {config['tokenizer_class']} under transformers {major}.x "
                f"(reproduced only as transformers {RULES_MAJOR}.x loads it)")
    if name == "LlamaTokenizer" and _byte_level(tokenizer_json):
        return None  # transformers loads TokenizersBackend: the file as written
    if name not in ("LlamaTokenizer", "Qwen2Tokenizer"):
        return f"{where}: tokenizer_class {config['tokenizer_class']} (its transformers class builds its own pipeline)"
    with open(tokenizer_json, encoding="utf-8") as f:
        model = json.load(f).get("model", {})
    if model.get("type") != "BPE":
        return (f"{where}: tokenizer_class {config['tokenizer_class']} over a {model.get('type')} model "
                f"(transformers rebuilds it as BPE)")
    return None


def refusal(reason: str) -> str:
    """The one line that stops a run whose tokenizer only transformers reproduces, when it is absent."""
    return (f"{reason}: the tokenizers library alone would give other ids than transformers; "
            f"install transformers (pip install transformers) to tokenize as upstream does")


def transformers_pipeline(tokenizer_json: Path, config: dict):
    """(model, normalizer, pre_tokenizer, decoder) as transformers 5's tokenizer class builds them
    from the file's vocabulary and merges, or None when the class runs the file as written."""
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers

    name = _class_name(config)
    if name not in ("LlamaTokenizer", "Qwen2Tokenizer") or (name == "LlamaTokenizer" and _byte_level(tokenizer_json)):
        return None
    with open(tokenizer_json, encoding="utf-8") as f:
        model = json.load(f)["model"]
    vocab = model["vocab"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model.get("merges", [])]
    if name == "LlamaTokenizer":
        # transformers.models.llama.tokenization_llama.LlamaTokenizer.__init__
        prefix = config.get("add_prefix_space")
        prefix = True if prefix is None else bool(prefix)
        scheme = ("first" if not config.get("legacy", False) else "always") if prefix else "never"
        steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        if prefix:
            steps.append(decoders.Strip(" ", 1, 0))
        return (models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, dropout=None),
                None, pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False),
                decoders.Sequence(steps))
    # transformers.models.qwen2.tokenization_qwen2.Qwen2Tokenizer.__init__
    split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    prefix = bool(config.get("add_prefix_space") or False)
    return (models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None, continuing_subword_prefix="",
                       end_of_word_suffix="", fuse_unk=False, byte_fallback=False),
            normalizers.NFC(),
            pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
                                     pre_tokenizers.ByteLevel(add_prefix_space=prefix, use_regex=False)]),
            decoders.ByteLevel())


def read_special_tokens(tokenizer_json: Path, tokenizer) -> dict:
    """Role -> token text, from tokenizer_config.json when present, else from the file's special tokens."""
    roles: dict = {}
    config = read_config(tokenizer_json)
    if config:
        for role in SPECIAL_ROLES:
            token = _token_text(config.get(f"{role}_token"))
            if token is not None:
                roles[role] = token
        if isinstance(config.get("chat_template"), str):
            roles["chat_template"] = config["chat_template"]
    listed = []
    for key in ("additional_special_tokens", "extra_special_tokens"):
        value = config.get(key)
        values = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
        listed += [t for t in map(_token_text, values) if t is not None]
    roles["listed"] = listed
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
        pipeline = transformers_pipeline(self.path, read_config(self.path))
        if pipeline is not None:
            model, normalizer, pre_tokenizer, decoder = pipeline
            self.tokenizer.model = model
            self.tokenizer.normalizer = normalizer
            self.tokenizer.pre_tokenizer = pre_tokenizer
            self.tokenizer.decoder = decoder
        roles = read_special_tokens(self.path, self.tokenizer)
        # What upstream's ids_to_text drops when asked to: the named special tokens and the listed ones.
        self._all_special = set(roles.pop("listed")) | set(self._additional)
        self._all_special |= {roles[r] for r in SPECIAL_ROLES if r in roles}
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
        # As upstream's wrapper: id -> token, special tokens dropped by name, the decoder over the rest.
        tokens = [self.tokenizer.id_to_token(int(i)) for i in ids]
        tokens = [t for t in tokens if t is not None and not (remove_special_tokens and t in self._all_special)]
        decoder = self.tokenizer.decoder
        return decoder.decode(tokens) if decoder is not None else " ".join(tokens)

    def tokens_to_text(self, tokens: List[str]) -> str:
        return self.ids_to_text(self.tokens_to_ids(tokens), remove_special_tokens=False)

    def add_special_tokens(self, special_tokens) -> int:
        from tokenizers import AddedToken

        if isinstance(special_tokens, dict):
            tokens = list(special_tokens.get("additional_special_tokens", []))
            tokens += [v for k, v in special_tokens.items() if k != "additional_special_tokens"]
        else:
            tokens = list(special_tokens)
        self._all_special |= set(tokens)
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
