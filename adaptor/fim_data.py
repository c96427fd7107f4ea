"""Fill-in-the-middle samples (``--fim-data``): what pretrain_gpt.py adds to its dataset config for
Megatron's ``GPTFIMDataset``, checked against the tokenizer first.

Megatron's FIM dataset cuts a sample's text at two random points and reorders the pieces around
sentinel tokens (prefix, middle, suffix; PSM or SPM order, ``--fim-spm-rate``), pads with the pad
token and splits documents at the EOD token. It looks the five tokens up in the tokenizer and uses
whatever comes back: a tokenizer without them gives ``None`` ids and a failure deep in numpy when the
first sample is read. So each token must be one entry of the vocabulary, and the flag that names a
missing one is reported in one line before any sample is built.
"""
from __future__ import annotations

# The FIM dataset's roles, as GPTFIMDatasetConfig.fim_extra_tokens names them, and the flag of each.
ROLES = (("prefix", "--fim-prefix-token"), ("middle", "--fim-middle-token"), ("suffix", "--fim-suffix-token"),
         ("pad", "--fim-pad-token"), ("eod", "--fim-eod-token"))


def token_id(tokenizer, token: str) -> int | None:
    """The id of ``token`` as one vocabulary entry, or None (also where it maps to the unknown token)."""
    library = tokenizer._tokenizer  # what GPTFIMDataset itself asks
    ids = library.tokens_to_ids([token])
    if not ids or ids[0] is None:
        return None
    back = getattr(library, "ids_to_tokens", None)
    if back is not None and back([ids[0]]) != [token]:
        return None
    return int(ids[0])


def fim_fields(args, tokenizer) -> dict:
    """The fields GPTFIMDatasetConfig adds to GPTDatasetConfig, from the ``--fim-*`` arguments.

    Raises ValueError naming the flag whose token the tokenizer does not have."""
    tokens = {role: getattr(args, flag[2:].replace("-", "_")) for role, flag in ROLES}
    for role, flag in ROLES:
        if token_id(tokenizer, tokens[role]) is None:
            raise ValueError(
                f"{flag} {tokens[role]}: the tokenizer has no such token, and --fim-data puts it into every "
                f"permuted sample; use a tokenizer with fill-in-the-middle tokens, or name its own with {flag}")
    if args.fim_split_sample is not None and token_id(tokenizer, args.fim_split_sample) is None:
        raise ValueError(f"--fim-split-sample {args.fim_split_sample}: not one token of this tokenizer; "
                         "FIM splits samples at a single token id")
    if not 0.0 <= args.fim_rate <= 1.0 or not 0.0 <= args.fim_spm_rate <= 1.0:
        raise ValueError(f"--fim-rate {args.fim_rate} / --fim-spm-rate {args.fim_spm_rate}: probabilities, "
                         "each between 0 and 1")
    return {"fim_rate": args.fim_rate, "fim_spm_rate": args.fim_spm_rate, "fim_extra_tokens": tokens,
            "fim_split_sample": args.fim_split_sample, "fim_fragment_rate": args.fim_fragment_rate,
            "fim_no_prefix": args.fim_no_prefix}
