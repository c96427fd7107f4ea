"""The tokenizer that writes the samples against the model that reads them, before a model is built.

The model finds an image's rows by its ``image_token_id``; the samples hold the id the data's tokenizer
gives ``<|image_pad|>``. When the two differ, nothing fails until the first step, which finds no (or the
wrong) placeholders for its image embeddings. The same holds for ``<|vision_start|>`` and ``<|video_pad|>``
(the 3-D positions start at a vision-start token), and for a tokenizer whose ids run past the embedding
table. Here each disagreement is one line naming both files, both values and the token.
"""
from __future__ import annotations

from adaptor.mm.schema import MMConfigError

# token -> (the model's config.json key, model.json's key for it)
VISION_TOKENS = {"<|image_pad|>": ("image_token_id", "img_context_token_id"),
                 "<|vision_start|>": ("vision_start_token_id", "vision_start_token_id"),
                 "<|video_pad|>": ("video_token_id", "video_token_id")}


def _model_source(model_cfg, json_key: str) -> str:
    """Where the model's id comes from: model.json's key, or the config.json of its Hugging Face directory
    (``init_from_hf_path`` or ``--hf-load-dir``)."""
    if model_cfg.init_from_hf_path is None:
        return f"{model_cfg.file}: {json_key}"
    return f"{model_cfg.file} ({model_cfg.hf_dir_source} {model_cfg.init_from_hf_path}/config.json)"


def check_tokenizer_matches_model(model_cfg, tokenizer, tokenizer_source: str) -> None:
    """``tokenizer`` (a ``tokenizers.Tokenizer``) gives the vision tokens the ids of ``model_cfg.hf_config``
    and fits its vocabulary; ``tokenizer_source`` names where it was read ("data.json: ... (dir)")."""
    from adaptor.mm.qwen_vl.model_json import text_config

    for token, (hf_key, json_key) in VISION_TOKENS.items():
        model_id, token_id = model_cfg.hf_config.get(hf_key), tokenizer.token_to_id(token)
        if model_id is not None and token_id is not None and model_id != token_id:
            raise MMConfigError(f"{_model_source(model_cfg, json_key)} has {hf_key} {model_id} but the tokenizer "
                                f"of {tokenizer_source} gives {token} id {token_id}; the two must agree")
    vocab = text_config(model_cfg).vocab_size
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > vocab:
        raise MMConfigError(f"the tokenizer of {tokenizer_source} has {size} tokens but {model_cfg.file}'s model has "
                            f"vocab_size {vocab}; ids past {vocab - 1} have no embedding")


def check_data_tokenizer(model_cfg, data_cfg) -> None:
    """data.json's tokenizer (``model_name_or_path``) against model.json's model."""
    from adaptor.mm.qwen_vl.samples import load_tokenizer

    where = f"{data_cfg.file}: dataset_param.preprocess_parameters.model_name_or_path"
    tokenizer, _, _ = load_tokenizer(data_cfg.model_name_or_path, where)
    check_tokenizer_matches_model(model_cfg, tokenizer, f"{where} ({data_cfg.model_name_or_path})")
