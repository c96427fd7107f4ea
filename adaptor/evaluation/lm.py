"""The ``lm_eval.api.model.LM`` that lm-eval drives: the Megatron model behind lm-eval's three requests.

It builds on lm-eval's ``TemplateLM``, which turns a (context, continuation) pair into token ids the
way lm-eval's own Hugging Face backend does (trailing spaces of the context moved to the
continuation; an empty context conditioned on the end-of-text token), so the same weights score the
same tokens through either backend.

* ``loglikelihood``: the context and continuation, cut on the left to ``--seq-length + 1`` tokens,
  scored in one forward; the sum of the continuation's log-probabilities and whether every one of its
  tokens was the argmax.
* ``loglikelihood_rolling``: the text in disjoint windows of ``--seq-length`` tokens (lm-eval's own
  window helpers), each scored as above.
* ``generate_until``: :func:`adaptor.inference.greedy_batch` (the loop inference.py runs), cut at the
  first of the request's ``until`` strings.
* ``apply_chat_template``: with a chat template (``render``), lm-eval renders each request as a
  conversation through it before the requests above.

Every process runs every request (the model's ranks work together on each batch), and the object
tells lm-eval it is rank 0 of 1, so lm-eval never splits requests across processes; ``evaluation.py``
writes and prints on global rank 0 only. ``--micro-batch-size`` requests go into one forward,
longest first (fewer padded positions).
"""
from __future__ import annotations

import json

from lm_eval.api.model import TemplateLM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from adaptor.evaluation.scoring import next_token_scores

DEFAULT_MAX_GEN_TOKS = 256


class MegatronLM(TemplateLM):
    def __init__(self, model, tokenizer, *, vocab_size: int, max_length: int, batch_size: int, render=None):
        super().__init__()
        self.render = render  # the chat template (inference.chat_renderer), when requests are conversations
        self.model = model
        self.megatron_tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.batch_size = batch_size

    # lm-eval splits requests over rank/world_size; every process here runs them all.
    @property
    def rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def eot_token_id(self) -> int:
        return int(self.megatron_tokenizer.eod)

    @property
    def tokenizer_name(self) -> str:
        return type(self.megatron_tokenizer).__name__

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt=True) -> str:
        return self.render(chat_history, add_generation_prompt=add_generation_prompt)

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.render.template_text if chat_template and self.render is not None else ""

    def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
        return [int(t) for t in self.megatron_tokenizer.tokenize(string)]

    def tok_decode(self, ids: list[int]) -> str:
        return self.megatron_tokenizer.detokenize(ids)

    def _score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(context ids, continuation ids) -> (sum of the continuation's log-probs, all greedy)."""
        rows = []
        for context, continuation in pairs:
            if not continuation:
                raise ValueError("lm-eval asked for the log-likelihood of an empty continuation")
            whole = (context + continuation)[-(self.max_length + 1):]
            rows.append(whole)
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        results: list[tuple[float, bool] | None] = [None] * len(rows)
        for first in range(0, len(order), self.batch_size):
            chunk = order[first: first + self.batch_size]
            scored = next_token_scores(self.model, [rows[i] for i in chunk], self.vocab_size)
            for i, (logprobs, greedy) in zip(chunk, scored):
                n = len(pairs[i][1])  # the continuation's tokens are the row's last n
                results[i] = (float(sum(logprobs[-n:])), all(greedy[-n:]))
        return results

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        out = self._score([(context, continuation) for _, context, continuation in requests])
        for (key, _, _), result in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood", key, result)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for request in requests:
            (text,) = request.args
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            total = sum(logprob for logprob, _ in self._score(windows))
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from adaptor.inference import greedy_batch

        out: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}  # requests with the same generation settings go together
        for i, request in enumerate(requests):
            groups.setdefault(json.dumps(request.args[1], sort_keys=True, default=str), []).append(i)
        for members in groups.values():
            kwargs = dict(requests[members[0]].args[1])
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_gen = int(kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
            max_gen = max(1, min(max_gen, self.max_length - 1))
            keep = self.max_length - max_gen  # the prompt's last tokens that leave room to generate
            for first in range(0, len(members), self.batch_size):
                chunk = members[first: first + self.batch_size]
                prompts = [self.tok_encode(requests[i].args[0])[-keep:] or [self.prefix_token_id] for i in chunk]
                generated = greedy_batch(self.model, prompts, max_new_tokens=max_gen, max_length=self.max_length,
                                         stops={self.eot_token_id}, vocab_size=self.vocab_size, use_kv_cache=True)
                for i, result in zip(chunk, generated):
                    ids = result.token_ids[:-1] if result.stopped else result.token_ids
                    text = self.tok_decode(ids)
                    for stop in until:
                        if stop:
                            text = text.split(stop)[0]
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return out
