"""Preference pairs for tools/preprocess_data.py: MindSpeed-LLM's pairwise handlers, for DPO.

* ``AlpacaStylePairwiseHandler``: ``instruction``/``input`` (optional ``system``, ``history``) and the two
  responses in ``chosen`` and ``rejected`` (or ``output`` holding ``[chosen, rejected]``, LLaMA-Factory's
  ranking layout).
* ``SharegptStylePairwiseHandler``: the prompt in ``conversations`` (or OpenAI-style ``messages``) and the
  responses in ``chosen`` / ``rejected``, each one assistant turn (``{"from": "gpt", "value": ...}``, a
  plain string, or a whole conversation whose last turn is the response; then both conversations must
  hold the same prompt).

Each side is rendered exactly as the supervised fine-tuning path renders a conversation (the same
:class:`chat_template.ChatRenderer`), then the labels keep only the final response: MindSpeed-LLM's
layout, ``PREFIX_packed_{chosen,rejected}_{input_ids,labels}_document``, ``-100`` outside the response,
plus ``PREFIX_packed_{chosen,rejected}_attention_mask_document``: each token's pair within its sample.
With ``--pack`` a sample holds several whole pairs, the k-th pair being the k-th segment of the chosen
row and of the rejected row, so a pair is never split between samples.
"""
from __future__ import annotations

from typing import Optional

from chat_template import IGNORE_INDEX, RecordError
import instruction_data

ALPACA = "AlpacaStylePairwiseHandler"
SHAREGPT = "SharegptStylePairwiseHandler"
HANDLERS = (ALPACA, SHAREGPT)
FIELDS = ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels")
# Each side's 1-based pair index per token: with --pack a sample holds several pairs, pair k being the k-th
# run of both sides (MindSpeed-LLM's instruction attention_mask, per side).
SEGMENT_FIELDS = ("chosen_attention_mask", "rejected_attention_mask")
# The instruction handler whose columns and conversion a pairwise handler reuses for the prompt.
PROMPT_HANDLER = {ALPACA: instruction_data.ALPACA, SHAREGPT: instruction_data.SHAREGPT}
RESPONSE_KEYS = {"chosen": "chosen", "rejected": "rejected"}


def parse_map_keys(text: Optional[str], handler: str) -> dict:
    """The instruction handler's keys plus ``chosen`` and ``rejected`` (``--map-keys`` may rename all)."""
    import json

    try:
        given = json.loads(text) if text else None
    except ValueError:
        given = None  # the instruction handler's parser reports it
    responses, rest = {}, text
    if isinstance(given, dict):
        responses = {k: given.pop(k) for k in list(given) if k in RESPONSE_KEYS}
        rest = json.dumps(given)
    keys = instruction_data.parse_map_keys(rest, PROMPT_HANDLER[handler])
    keys.update({**RESPONSE_KEYS, **responses})
    return keys


def _response_text(value, where: str, content_tag: str) -> str:
    if isinstance(value, dict):
        value = value.get(content_tag, value.get("content", value.get("value")))
    if not isinstance(value, str):
        raise RecordError(f"the {where} response is {type(value).__name__}, expected a string or one turn")
    if not value.strip():
        raise RecordError(f"the {where} response is empty")
    return value


def _responses(record: dict, keys: dict):
    """The (chosen, rejected) values: their own columns, or ``output``/``response`` as ``[chosen, rejected]``."""
    chosen, rejected = record.get(keys["chosen"]), record.get(keys["rejected"])
    if chosen is None and rejected is None:
        pair = record.get(keys.get("response") or "output")
        if isinstance(pair, list) and len(pair) == 2:
            return pair[0], pair[1]
    for name, value in (("chosen", chosen), ("rejected", rejected)):
        if value is None:
            raise RecordError(f"missing key {keys[name]!r} (the {name} response)")
    return chosen, rejected


def alpaca_pair(record: dict, keys: dict):
    """(prompt messages, chosen text, rejected text, tools) of an alpaca-style pair."""
    chosen, rejected = _responses(record, keys)
    chosen, rejected = _response_text(chosen, "chosen", "content"), _response_text(rejected, "rejected", "content")
    messages, _ = instruction_data.alpaca_conversation({**record, keys["response"] or "output": "-"}, keys)
    return messages[:-1], chosen, rejected, None


def sharegpt_pair(record: dict, keys: dict):
    """(prompt messages, chosen text, rejected text, tools) of a ShareGPT-style pair."""
    chosen, rejected = _responses(record, keys)
    content_tag = keys["content_tag"]
    if isinstance(chosen, list) or isinstance(rejected, list):
        if not (isinstance(chosen, list) and isinstance(rejected, list) and chosen and rejected):
            raise RecordError("chosen and rejected must both be whole conversations, or both single responses")
        prompts = []
        for name, turns in (("chosen", chosen), ("rejected", rejected)):
            messages, tools = instruction_data.sharegpt_conversation({**record, keys["messages"]: turns}, keys)
            if messages[-1]["role"] != "assistant":
                raise RecordError(f"the {name} conversation does not end with an assistant turn")
            prompts.append((messages[:-1], _response_text(messages[-1]["content"], name, content_tag)))
        if prompts[0][0] != prompts[1][0]:
            raise RecordError("the chosen and rejected conversations have different prompts")
        return prompts[0][0], prompts[0][1], prompts[1][1], tools
    messages, tools = instruction_data.sharegpt_conversation(record, keys)
    if messages and messages[-1]["role"] == "assistant":
        raise RecordError("the prompt ends with an assistant turn; the responses belong in chosen and rejected")
    return messages, _response_text(chosen, "chosen", content_tag), _response_text(rejected, "rejected",
                                                                                   content_tag), tools


CONVERTERS = {ALPACA: alpaca_pair, SHAREGPT: sharegpt_pair}


def final_response_only(ids: list, labels: list) -> tuple[list, int]:
    """``labels`` with every turn before the final response set to -100, and the response's first index.

    The final response is the last run of labelled tokens (what follows it, such as the newline after
    the end-of-turn token, is already -100)."""
    end = len(labels)
    while end > 0 and labels[end - 1] == IGNORE_INDEX:
        end -= 1
    start = end
    while start > 0 and labels[start - 1] != IGNORE_INDEX:
        start -= 1
    return [IGNORE_INDEX] * start + list(labels[start:]), start


def encode_pair(renderer, prompt: list, chosen: str, rejected: str, tools=None):
    """``(chosen_ids, chosen_labels, rejected_ids, rejected_labels)``: each side rendered as one conversation."""
    turns = sum(1 for m in prompt if m.get("role") == "assistant") + 1
    sides = []
    for response in (chosen, rejected):
        messages = [*prompt, {"role": "assistant", "content": response}]
        item = renderer.encode_rendered([renderer.render(messages, tools)], [turns])[0]
        if isinstance(item, RecordError):
            raise item
        labels, start = final_response_only(*item)
        sides.append((list(item[0]), labels, start))
    (c_ids, c_labels, c_start), (r_ids, r_labels, r_start) = sides
    if c_ids[:c_start] != r_ids[:r_start]:
        raise RecordError("the chosen and rejected conversations render different prompts")
    return c_ids, c_labels, r_ids, r_labels
