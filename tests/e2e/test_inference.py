"""inference.py: greedy tokens equal transformers' generate on the same weights, and bad input is one line.

A tiny random Qwen3 (tests/helpers/hf_fixtures.py, fp32) with the repository's sample tokenizer's
vocabulary is read through --hf-load-dir (the training's online conversion). Three prompts of
different lengths go in one batch (--micro-batch-size 3, right-padded inside the loop); the token ids
written to --output-file equal ``model.generate(do_sample=False, max_new_tokens=N)`` prompt by prompt:

* TP1 without the KV cache;
* TP1 with --use-kv-cache, and a second stop token (--add-eos-token) that ends one prompt early, so
  that rows end one by one;
* TP2 (two processes, gloo) with --use-kv-cache and the same stop token;
* --bf16 with the KV cache equals transformers' generate in bf16 (these prompts' greedy margins are
  wide, so both precisions pick the same tokens).

Beam search (``--task beam_search --num-beams 3``) equals ``generate(num_beams=3, do_sample=False)``
prompt by prompt, at TP1 with the KV cache (reordered with the beams) and at TP2 without it. Sampling
(``--task greedy_search_with_sampling``, top-k, top-p and temperature, one ``--seed``) draws the same
tokens at TP1 and TP2: the logits agree to fp32 rounding and every rank draws from one seeded generator,
so a draw could only differ where it lands within rounding of a probability boundary; beam search with
sampling likewise. The distribution it draws from is tests/unit/test_sampling.py's. At TP2 the sampled
run is ``--task return_output_log_probs``: each token's log-probability equals transformers'
log-softmax at that position within 1e-4 (fp32 logits agree to about 1e-5).
"""
from __future__ import annotations

import json

import pytest
import torch

from helpers.hf_fixtures import make_peft_adapter, make_tiny_deepseek_v3, make_tiny_qwen3
from helpers.megatron_runs import SAMPLE_TOKENIZER, launch, side_by_side, tail
from helpers.one_line_errors import assert_one_line_error, run_python

PROMPTS = ["Once upon a time", "The capital of the old kingdom was a small town near the", "Add"]
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """The HF directory and the model flags that describe it (with the sample tokenizer)."""
    from transformers import AutoTokenizer

    import adaptor  # noqa: F401  (before patches: it registers them)
    from adaptor.convert.config_check import model_flags

    tokenizer = AutoTokenizer.from_pretrained(str(SAMPLE_TOKENIZER))
    hf_dir = make_tiny_qwen3(tmp_path_factory.mktemp("inference") / "qwen3", vocab_size=len(tokenizer), seed=3)
    flags = model_flags("qwen3", json.loads((hf_dir / "config.json").read_text()))
    flags += ["--seq-length", "64", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
              str(SAMPLE_TOKENIZER), "--disable-jit-fuser"]
    return hf_dir, tokenizer, flags  # the weights' flag is each test's


def hf_greedy(hf_dir, tokenizer, eos_ids: list[int], num_beams: int = 1, adapter=None,
              dtype=torch.float32) -> list[list[int]]:
    """transformers' greedy (or beam) continuation of each prompt alone, cut after its first stop token;
    with ``adapter``, peft's LoRA model on top."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=dtype, attn_implementation="eager")
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    model.eval()
    out = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            generated = model.generate(input_ids=ids, do_sample=False, num_beams=num_beams, max_new_tokens=NEW_TOKENS,
                                       eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id,
                                       length_penalty=1.0, early_stopping=False)[0, ids.shape[1]:].tolist()
        cut = next((i + 1 for i, t in enumerate(generated) if t in eos_ids), len(generated))
        out.append(generated[:cut])
    return out


def hf_log_probs(hf_dir, tokenizer, record) -> list[float]:
    """transformers' log-softmax, at each generated position, of the token generated there."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32, attn_implementation="eager").eval()
    prompt = tokenizer(record["prompt"]).input_ids
    ids = torch.tensor([prompt + record["token_ids"]])
    with torch.no_grad():
        scores = torch.log_softmax(model(ids).logits[0, len(prompt) - 1: -1].float(), dim=-1)
    return scores.gather(-1, ids[0, len(prompt):, None]).squeeze(-1).tolist()


def generate(flags, tmp_path, name, nproc=1, extra=(), tp=None):
    """inference.py's records for PROMPTS; ``nproc`` processes, tensor parallel ``tp`` (default: all of them)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    out = tmp_path / f"{name}.jsonl"
    run = launch("inference.py", [*flags, "--input-file", str(prompts), "--output-file", str(out),
                                  "--micro-batch-size", "3", "--max-new-tokens", str(NEW_TOKENS),
                                  "--tensor-model-parallel-size", str(tp or nproc), *extra], nproc=nproc)
    assert run.returncode == 0, tail(run.output)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in records] == PROMPTS
    return records


def test_greedy_tokens_equal_transformers(qwen3, tmp_path):
    hf_dir, tokenizer, flags = qwen3
    flags = [*flags, "--hf-load-dir", str(hf_dir)]
    eos = tokenizer.eos_token_id
    expected = hf_greedy(hf_dir, tokenizer, [eos])
    assert len({len(tokenizer(p).input_ids) for p in PROMPTS}) == 3  # three prompt lengths in one batch

    # --bf16 (Megatron's Float16Module) against transformers in bf16 on the same weights.
    plain, bf16 = side_by_side(lambda: generate(flags, tmp_path, "tp1"),
                               lambda: generate(flags, tmp_path, "tp1_bf16", extra=["--bf16", "--use-kv-cache"]))
    assert [r["token_ids"] for r in plain] == expected
    assert [r["token_ids"] for r in bf16] == hf_greedy(hf_dir, tokenizer, [eos], dtype=torch.bfloat16)
    for record in plain:
        kept = [t for t in record["token_ids"] if t != eos]
        assert record["text"] == tokenizer.decode(kept, skip_special_tokens=True)

    # A second stop token: the first token prompt 0 generates that prompt 1 does not, so prompt 0
    # ends early and the others go on in the same batch.
    stop = next(t for t in expected[0] if t not in expected[1] and t != eos)
    stopped = hf_greedy(hf_dir, tokenizer, [eos, stop])
    assert len(stopped[0]) < len(expected[0]) and stopped[1] == expected[1]
    extra = ["--use-kv-cache", "--add-eos-token", str(stop)]
    assert [r["token_ids"] for r in generate(flags, tmp_path, "tp1_kv", extra=extra)] == stopped
    assert [r["token_ids"] for r in generate(flags, tmp_path, "tp2_kv", nproc=2, extra=extra)] == stopped


def test_beam_search_equals_transformers_and_sampling_is_the_same_on_every_layout(qwen3, tmp_path):
    hf_dir, tokenizer, flags = qwen3
    flags = [*flags, "--hf-load-dir", str(hf_dir)]
    expected = hf_greedy(hf_dir, tokenizer, [tokenizer.eos_token_id], num_beams=3)
    assert expected != hf_greedy(hf_dir, tokenizer, [tokenizer.eos_token_id])  # beams find other sequences
    beams = ["--task", "beam_search", "--num-beams", "3"]
    sampling = ["--task", "greedy_search_with_sampling", "--top-k", "20", "--top-p", "0.9", "--temperature", "0.8",
                "--seed", "7", "--use-kv-cache"]
    beam_sampling = ["--task", "beam_search_with_sampling", "--num-beams", "2", "--top-k", "20", "--seed", "3"]
    beam_tp1, sampled_tp1, beam_sampled_tp1 = side_by_side(
        lambda: generate(flags, tmp_path, "beam_tp1", extra=[*beams, "--use-kv-cache"]),
        lambda: generate(flags, tmp_path, "sampled_tp1", extra=sampling),
        lambda: generate(flags, tmp_path, "beam_sampled_tp1", extra=beam_sampling))
    assert [r["token_ids"] for r in beam_tp1] == expected
    assert [r["token_ids"] for r in generate(flags, tmp_path, "beam_tp2", nproc=2, extra=beams)] == expected
    # At TP2 the sampled task is return_output_log_probs: the same draws, and each token's log-probability.
    with_log_probs = ["--task", "return_output_log_probs", *sampling[2:]]
    for name, extra, tp1 in (("sampled_tp2", with_log_probs, sampled_tp1),
                             ("beam_sampled_tp2", beam_sampling, beam_sampled_tp1)):
        tp2 = generate(flags, tmp_path, name, nproc=2, extra=extra)
        assert [r["token_ids"] for r in tp2] == [r["token_ids"] for r in tp1], name
        if name == "sampled_tp2":  # fp32 logits agree with transformers' to about 1e-5
            gaps = [abs(a - b) for r in tp2 for a, b in zip(r["log_probs"], hf_log_probs(hf_dir, tokenizer, r), strict=True)]
            assert max(gaps) < 1e-4, max(gaps)
    greedy = hf_greedy(hf_dir, tokenizer, [tokenizer.eos_token_id])
    assert [r["token_ids"] for r in sampled_tp1] != greedy
    assert [r["token_ids"] for r in beam_sampled_tp1] not in (greedy, expected)


def test_stream_prints_the_greedy_text(qwen3, tmp_path):
    """--stream writes the text piece by piece as it is generated; the whole is the greedy continuation."""
    hf_dir, tokenizer, flags = qwen3
    run = run_python([*flags, "--hf-load-dir", str(hf_dir), "--prompt", PROMPTS[1], "--stream",
                      "--max-new-tokens", str(NEW_TOKENS)], tmp_path, script="inference.py")
    assert run.returncode == 0, tail(run.stdout + run.stderr)
    greedy = hf_greedy(hf_dir, tokenizer, [tokenizer.eos_token_id])[1]
    text = tokenizer.decode([t for t in greedy if t != tokenizer.eos_token_id], skip_special_tokens=True)
    assert text.strip() and text + "\n" in run.stdout, (text, run.stdout[-500:])


CONVERSATIONS = [
    [{"role": "user", "content": "Tell me about the old kingdom."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a town"}],
]


def test_chat_renders_as_transformers_and_generates_its_greedy_reply(qwen3, tmp_path):
    """--task chat: the prompt ids equal apply_chat_template(add_generation_prompt=True) with the tokenizer's
    own template, and the reply equals transformers' greedy continuation of them; a tokenizer without a
    template and no --prompt-type is one line."""
    from transformers import AutoModelForCausalLM

    hf_dir, tokenizer, flags = qwen3
    conversations = tmp_path / "chats.jsonl"
    conversations.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CONVERSATIONS))
    out = tmp_path / "chat.jsonl"
    run = launch("inference.py", [*flags, "--hf-load-dir", str(hf_dir), "--task", "chat", "--input-file",
                                  str(conversations), "--output-file", str(out), "--max-new-tokens", "6"], nproc=1)
    assert run.returncode == 0, tail(run.output)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32, attn_implementation="eager")
    for record, messages in zip(records, CONVERSATIONS):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert record["messages"] == messages and record["prompt_token_ids"] == list(ids)
        with torch.no_grad():
            reply = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=6,
                                   eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        expected = reply[0, len(ids):].tolist()
        cut = next((i + 1 for i, t in enumerate(expected) if t == tokenizer.eos_token_id), len(expected))
        assert record["token_ids"] == expected[:cut]

    bare = tmp_path / "bare_tokenizer"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes((SAMPLE_TOKENIZER / "tokenizer.json").read_bytes())
    flags_bare = [f if f != str(SAMPLE_TOKENIZER) else str(bare) for f in flags]
    refused = run_python([*flags_bare, "--hf-load-dir", str(hf_dir), "--task", "chat", "--prompt", "Hi"], tmp_path,
                         script="inference.py")
    assert_one_line_error(refused, ["--task chat needs a chat template", "--prompt-type"], torchrun=False)


def test_deepseek_v3_greedy_equals_transformers_at_tp1_ep2_and_pp2(tmp_path):
    """MLA, MoE (sigmoid routing with group limits, a shared expert) and an MTP layer, which generation
    skips as transformers does: the same greedy ids at one process (no cache), and at EP=2 and PP=2 with
    the KV cache (MLA's keys and values kept in the static context; YaRN positions from its offset)."""
    from transformers import AutoTokenizer

    import adaptor  # noqa: F401
    from adaptor.convert.config_check import model_flags

    tokenizer = AutoTokenizer.from_pretrained(str(SAMPLE_TOKENIZER))
    hf_dir = make_tiny_deepseek_v3(tmp_path / "deepseek_v3", vocab_size=len(tokenizer), seed=3)
    flags = model_flags("deepseek3", json.loads((hf_dir / "config.json").read_text()))
    flags += ["--seq-length", "64", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
              str(SAMPLE_TOKENIZER), "--disable-jit-fuser", "--hf-load-dir", str(hf_dir)]
    expected = hf_greedy(hf_dir, tokenizer, [tokenizer.eos_token_id])
    one, ep2 = side_by_side(lambda: generate(flags, tmp_path, "ds_tp1"),
                            lambda: generate(flags, tmp_path, "ds_ep2", nproc=2, tp=1,
                                             extra=["--expert-model-parallel-size", "2", "--use-kv-cache"]))
    pp2 = generate(flags, tmp_path, "ds_pp2", nproc=2, tp=1,
                   extra=["--pipeline-model-parallel-size", "2", "--use-kv-cache"])
    for name, records in (("tp1", one), ("ep2_kv", ep2), ("pp2_kv", pp2)):
        assert [r["token_ids"] for r in records] == expected, name


def test_lora_adapters_generate_as_peft_does(qwen3, tmp_path):
    """--lora-load of a PEFT adapter on the base weights: greedy ids equal peft + transformers' at TP1 (with
    the KV cache) and TP2, and differ from the base model's."""
    hf_dir, tokenizer, flags = qwen3
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    adapter = make_peft_adapter(hf_dir, tmp_path / "peft_adapter", r=4, alpha=8, targets=targets)
    lora = ["--hf-load-dir", str(hf_dir), "--lora-r", "4", "--lora-alpha", "8", "--lora-dropout", "0",
            "--lora-target-modules", "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "--lora-load", str(adapter)]
    expected = hf_greedy(hf_dir, tokenizer, [tokenizer.eos_token_id], adapter=adapter)
    assert expected != hf_greedy(hf_dir, tokenizer, [tokenizer.eos_token_id])
    one = generate([*flags, *lora], tmp_path, "lora_tp1", extra=["--use-kv-cache"])
    tp2 = generate([*flags, *lora], tmp_path, "lora_tp2", nproc=2)
    assert [r["token_ids"] for r in one] == expected
    assert [r["token_ids"] for r in tp2] == expected


def test_missing_checkpoint_is_one_line(qwen3, tmp_path):
    _, _, flags = qwen3
    run = run_python([*flags, "--load", str(tmp_path / "no_such_ckpt"), "--prompt", "Once"], tmp_path,
                     script="inference.py")
    assert_one_line_error(run, ["--load", "no_such_ckpt"], torchrun=False)


def test_prompt_longer_than_seq_length_is_one_line(qwen3, tmp_path):
    hf_dir, _, flags = qwen3
    run = run_python([*flags, "--hf-load-dir", str(hf_dir), "--prompt", "word " * 80], tmp_path, script="inference.py")
    assert_one_line_error(run, ["--prompt", "--seq-length 64"], torchrun=False)


def test_mindspeed_llm_generate_script_runs_every_task(tmp_path):
    """MindSpeed-LLM's examples/mcore/qwen3/generate_qwen3_14b_ptd.sh as published, every flag kept, sizes
    scaled (layers, widths, heads, vocabulary, sequence, new tokens, TP), on a checkpoint tools/convert_ckpt.py
    wrote at TP2: like its own inference.py, with no --task and no prompt it runs every task on its
    demonstration prompt, in its order, and ends in the terminal chat, which ends at end of input. The greedy
    task's tokens are transformers' bf16 greedy ones (the script runs --bf16)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptor.convert import Layout, convert_hf_to_megatron
    from adaptor.inference import DEMONSTRATION_PROMPT, DEMONSTRATION_TASKS

    tokenizer = AutoTokenizer.from_pretrained(str(SAMPLE_TOKENIZER))
    hf_dir = make_tiny_qwen3(tmp_path / "qwen3", tied=False, vocab_size=len(tokenizer), seed=5)
    checkpoint = convert_hf_to_megatron(hf_dir, tmp_path / "mg", "qwen3", Layout(tp=2), save_format="torch")
    script = ["--use-mcore-models", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1",
              "--load", str(checkpoint), "--spec", "mindspeed_llm.tasks.models.spec.qwen3_spec", "layer_spec",
              "--kv-channels", "32", "--qk-layernorm", "--num-layers", "4", "--hidden-size", "64",
              "--use-rotary-position-embeddings", "--untie-embeddings-and-output-weights", "--num-attention-heads", "4",
              "--ffn-hidden-size", "192", "--max-position-embeddings", "64", "--seq-length", "64",
              "--make-vocab-size-divisible-by", "1", "--padded-vocab-size", "1536", "--rotary-base", "1000000",
              "--micro-batch-size", "1", "--disable-bias-linear", "--swiglu", "--use-rotary-position-embeddings",
              "--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", str(SAMPLE_TOKENIZER),
              "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--norm-epsilon", "1e-6",
              "--hidden-dropout", "0", "--attention-dropout", "0", "--max-new-tokens", "6",
              "--no-gradient-accumulation-fusion", "--attention-softmax-in-fp32", "--exit-on-missing-checkpoint",
              "--no-masked-softmax-fusion", "--group-query-attention", "--num-query-groups", "2", "--seed", "42",
              "--bf16", "--prompt-type", "chatml"]
    run = launch("inference.py", script, nproc=2)
    assert run.returncode == 0, tail(run.output)
    headers = [line[3:-3] for line in run.output.splitlines() if line.startswith("== ") and line.endswith(" ==")]
    assert headers == list(DEMONSTRATION_TASKS), tail(run.output)
    assert "inference.py chat: 'clear' or 'new' starts over" in run.output, tail(run.output)
    greedy = run.output.splitlines()[run.output.splitlines().index("== greedy_search ==") + 1]
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.bfloat16).eval()
    ids = tokenizer(DEMONSTRATION_PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        new = model.generate(input_ids=ids, do_sample=False, max_new_tokens=6, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id)[0, ids.shape[1]:].tolist()
    assert greedy == tokenizer.decode([t for t in new if t != tokenizer.eos_token_id], skip_special_tokens=True)
