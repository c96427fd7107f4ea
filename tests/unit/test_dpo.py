"""DPO's pieces in-process: the losses against their closed forms, and the pairwise handler against the
supervised fine-tuning renderer.

* Losses (adaptor/preference/losses.py): sigmoid with and without label smoothing, hinge and IPO on
  random log-probabilities, against the formulas written out here in plain Python floats; equal
  policy and reference give ln 2 and zero rewards; the report's [sum, count] pairs.
* Pairwise handler (tools/pairwise_data.py): each side's ids are exactly what the SFT path
  (ChatRenderer.encode, itself checked against transformers in test_chat_template.py) gives for the same
  conversation; the labels keep only the final response (history turns, which SFT trains on, drop
  out); the written datasets read back (adaptor/preference/pairwise_dataset.py) as [2, seq] rows whose
  loss mask covers the response tokens; an empty response or two different prompts is one line.
* Packed pairs (``--pack``): every pair lands whole in one sample, chosen and rejected as the same
  segment of the two rows; a packed sample's per-pair sequence log-probabilities (by ``pair_slot``,
  positions restarting per pair) equal those of the same pairs stored one per sample; its ``pair_index``
  numbers every pair of the dataset once (the stored reference's rows).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from adaptor.preference.losses import dpo_loss, sequence_logps
from adaptor.preference.metrics import dpo_report
from helpers.paths import SAMPLE_TOKENIZER
from helpers.processes import import_tool

chat_template = import_tool("chat_template")
pairwise_data = import_tool("pairwise_data")
IGNORE = -100


def _logsig(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def closed_form(pc, pr, rc, rr, beta, kind, eps):
    h = (pc - pr) - (rc - rr)
    if kind == "sigmoid":
        return -(1 - eps) * _logsig(beta * h) - eps * _logsig(-beta * h)
    if kind == "hinge":
        return max(0.0, 1 - beta * h)
    return (h - 1 / (2 * beta)) ** 2


@pytest.mark.parametrize("kind,beta,eps", [("sigmoid", 0.1, 0.0), ("sigmoid", 0.5, 0.2), ("hinge", 0.3, 0.0),
                                           ("ipo", 0.2, 0.0)])
def test_losses_equal_their_closed_forms(kind, beta, eps):
    g = torch.Generator().manual_seed(0)
    pc, pr, rc, rr = (-20 * torch.rand(16, generator=g, dtype=torch.float64) for _ in range(4))
    losses, chosen, rejected = dpo_loss(pc, pr, rc, rr, beta, kind, eps)
    expected = [closed_form(*map(float, v), beta, kind, eps) for v in zip(pc, pr, rc, rr)]
    torch.testing.assert_close(losses, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(chosen, beta * (pc - rc))
    torch.testing.assert_close(rejected, beta * (pr - rr))
    if kind == "hinge":
        assert (losses == 0).any() or (beta * ((pc - pr) - (rc - rr)) < 1).all()


def test_policy_equal_to_reference_gives_ln2_and_zero_rewards():
    logps = torch.tensor([-3.0, -7.5, -1.25])
    losses, chosen, rejected = dpo_loss(logps, logps - 2, logps, logps - 2, 0.1)
    torch.testing.assert_close(losses, torch.full((3,), math.log(2)), rtol=0, atol=1e-7)
    assert chosen.abs().max() == 0 and rejected.abs().max() == 0
    report = dpo_report(losses, chosen, rejected)
    assert report["dpo loss"].tolist() == pytest.approx([3 * math.log(2), 3.0])
    assert report["rewards/margins"].tolist() == [0.0, 3.0] and report["rewards/accuracies"].tolist() == [0.0, 3.0]


def test_sequence_logps_sum_and_mean_over_the_response():
    token = torch.tensor([[-1.0, -2.0, -4.0, -8.0], [-1.0, -1.0, -1.0, -1.0]])
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.float32)
    assert sequence_logps(token, mask).tolist() == [-6.0, -4.0]
    assert sequence_logps(token, mask, average=True).tolist() == [-3.0, -1.0]
    report = dpo_report(torch.tensor([1.0, 3.0]), torch.tensor([0.5, -1.0]), torch.tensor([0.25, 2.0]),
                        torch.tensor([2.0, 4.0]))
    assert report["rewards/margins"].tolist() == [0.25 - 3.0, 2.0]
    assert report["rewards/accuracies"].tolist() == [1.0, 2.0] and report["sft loss"].tolist() == [6.0, 2.0]


@pytest.fixture(scope="module")
def renderer():
    from tokenizers import Tokenizer

    library = Tokenizer.from_file(str(SAMPLE_TOKENIZER / "tokenizer.json"))
    return chat_template.ChatRenderer(library, SAMPLE_TOKENIZER, chat_template.prompt_type("qwen3"))


PAIR = {"system": "Answer as precisely as you can.", "instruction": "What is 2 + 3?", "input": "",
        "history": [["Say hello.", "hello"]], "chosen": "2 + 3 = 5.", "rejected": "seven"}


def test_each_side_is_the_sft_rendering_with_labels_on_the_final_response_only(renderer):
    keys = pairwise_data.parse_map_keys(None, pairwise_data.ALPACA)
    prompt, chosen, rejected, tools = pairwise_data.alpaca_pair(PAIR, keys)
    c_ids, c_labels, r_ids, r_labels = pairwise_data.encode_pair(renderer, prompt, chosen, rejected, tools)
    for ids, labels, response in ((c_ids, c_labels, chosen), (r_ids, r_labels, rejected)):
        sft_ids, sft_labels = renderer.encode([*prompt, {"role": "assistant", "content": response}])
        assert ids == sft_ids
        start = next(i for i, v in enumerate(labels) if v != IGNORE)
        assert labels[start:] == sft_labels[start:]  # the final turn as SFT labels it
        assert sum(v != IGNORE for v in sft_labels[:start]) > 0  # SFT also trains on the history turn
        assert response in renderer.tokenizer.decode([v for v in labels if v != IGNORE], skip_special_tokens=False)
    c_start = next(i for i, v in enumerate(c_labels) if v != IGNORE)
    assert c_ids[:c_start] == r_ids[:c_start] and c_ids[c_start:] != r_ids[c_start:]


def test_sharegpt_pairs_and_bad_pairs(renderer):
    keys = pairwise_data.parse_map_keys(None, pairwise_data.SHAREGPT)
    turns = [{"from": "human", "value": "What is 2 + 3?"}]
    record = {"conversations": turns, "chosen": {"from": "gpt", "value": "5"}, "rejected": {"from": "gpt", "value": "6"}}
    prompt, chosen, rejected, _ = pairwise_data.sharegpt_pair(record, keys)
    assert (prompt, chosen, rejected) == ([{"role": "user", "content": "What is 2 + 3?"}], "5", "6")
    whole = {"chosen": turns + [{"from": "gpt", "value": "5"}], "rejected": turns + [{"from": "gpt", "value": "6"}]}
    assert pairwise_data.sharegpt_pair(whole, keys)[:3] == (prompt, "5", "6")
    differ = {"chosen": whole["chosen"], "rejected": [{"from": "human", "value": "What is 2 + 4?"},
                                                      {"from": "gpt", "value": "6"}]}
    with pytest.raises(chat_template.RecordError, match="different prompts"):
        pairwise_data.sharegpt_pair(differ, keys)
    alpaca = pairwise_data.parse_map_keys(None, pairwise_data.ALPACA)
    with pytest.raises(chat_template.RecordError, match="rejected response is empty"):
        pairwise_data.alpaca_pair({**PAIR, "rejected": "  "}, alpaca)


def test_the_tool_writes_pairs_that_the_dataset_reads_back(tmp_path, capsys):
    from adaptor.preference.pairwise_dataset import PairwiseLowLevel, build_pair

    preprocess = import_tool("preprocess_data")
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(json.dumps({**PAIR, "chosen": f"{k} apples", "rejected": "no"}) for k in range(3)) + "\n")
    common = ["--input", str(data), "--handler-name", "AlpacaStylePairwiseHandler", "--prompt-type", "qwen3",
              "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(SAMPLE_TOKENIZER)]
    assert preprocess.main([*common, "--output-prefix", str(tmp_path / "out")]) == 0
    low = PairwiseLowLevel(str(tmp_path / "out"))
    assert len(low) == 3
    ids, labels, _ = low.side(1, "chosen")
    pair = build_pair(low, 1, 96, 0)
    assert pair["tokens"].shape == (2, 96)
    n = len(ids) - 1
    assert pair["tokens"][0, :n].tolist() == ids[:-1].tolist()
    assert pair["loss_mask"][0, :n].tolist() == (labels[1:] != IGNORE).astype(np.float32).tolist()
    assert (pair["labels"][0][pair["loss_mask"][0].bool()] == torch.from_numpy(labels[1:][labels[1:] != IGNORE])).all()
    data.write_text(json.dumps({**PAIR, "chosen": ""}) + "\n")
    capsys.readouterr()
    assert preprocess.main([*common, "--output-prefix", str(tmp_path / "bad")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("preprocess_data.py: error:") and "chosen response is empty" in err[-1], err


def _token_logps(sample: dict) -> torch.Tensor:
    """A stand-in for a model's per-token log-probabilities: a function of the target token and of the
    position within its sequence only, as a causal model's output is when sequences attend only to
    themselves (which the run's masks and THD boundaries ensure)."""
    return -torch.sin(sample["labels"].double() * 0.37 + sample["position_ids"].double() * 0.11).abs() - 0.01


def test_packed_pairs_stay_whole_and_give_each_pair_its_own_logps(tmp_path):
    from adaptor.preference.pairwise_dataset import PAIR_INDEX, PAIR_SLOT, PairwiseLowLevel, build_pair, max_pairs

    from helpers.paths import EXAMPLES

    preprocess = import_tool("preprocess_data")
    common = ["--input", str(EXAMPLES / "data" / "sample_pairs.jsonl"), "--handler-name", "AlpacaStylePairwiseHandler",
              "--prompt-type", "qwen3", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
              str(SAMPLE_TOKENIZER), "--seq-length", "300"]
    assert preprocess.main([*common, "--output-prefix", str(tmp_path / "one")]) == 0
    assert preprocess.main([*common, "--output-prefix", str(tmp_path / "packed"), "--pack"]) == 0
    one, packed = PairwiseLowLevel(str(tmp_path / "one")), PairwiseLowLevel(str(tmp_path / "packed"))
    assert not one.packed and packed.packed and packed.num_pairs == one.num_pairs == len(one) > 2 * len(packed)
    def whole(low, i, k=None):  # pair k of sample i (its only pair without k), as (chosen ids, rejected ids)
        sides = [low.side(i, side) for side in ("chosen", "rejected")]
        return tuple(tuple(ids[seg == k + 1] if k is not None else ids) for ids, _, seg in sides)

    alone_at = {whole(one, i): i for i in range(len(one))}
    seq, seen = 299, []
    for i in range(len(packed)):
        sample = build_pair(packed, i, seq, 0)
        count = int(packed.pairs_per_sample[i])
        assert sample[PAIR_INDEX].shape == (max_pairs(seq),) and (sample[PAIR_INDEX][count:] == -1).all()
        seen += sample[PAIR_INDEX][:count].tolist()
        logps = sequence_logps(_token_logps(sample), sample["loss_mask"], slots=sample[PAIR_SLOT]
                               + torch.tensor([[0], [count]]), num_slots=2 * count)
        for side, row in (("chosen", 0), ("rejected", 1)):
            ids, _, seg = packed.side(i, side)
            assert seg.tolist() == sorted(seg.tolist()) and seg[-1] == count  # k-th run of each row is pair k
            for k in range(count):
                alone = alone_at[whole(packed, i, k)]
                assert ids[seg == k + 1].tolist() == one.side(alone, side)[0].tolist()
                reference = build_pair(one, alone, seq, 0)
                want = sequence_logps(_token_logps(reference), reference["loss_mask"])[row]
                # the same ~100 values summed in another order, rounded to float32; a token of another
                # pair moves it by 1e-2
                assert float(logps[row * count + k]) == pytest.approx(float(want), rel=1e-6)
    assert sorted(seen) == list(range(packed.num_pairs))


def _validate(tmp_path, **given):
    """PreferenceTraining's checks on a DPO command line's arguments (``given`` overrides, all explicit)."""
    import argparse

    from adaptor.features import FeatureContext
    from patches.finetune.preference_training import PreferenceTraining

    prefix = tmp_path / "pairs"
    for field in ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels"):
        for ext in (".bin", ".idx"):
            (tmp_path / f"pairs_packed_{field}_document{ext}").write_bytes(b"")
    args = dict(stage="dpo", is_pairwise_dataset=True, is_instruction_dataset=False, sft=False, mock_data=False,
                load=None, finetune=False, ref_model=None, hf_load_dir=str(tmp_path), lora_r=None, refer_model_iter=1,
                dpo_beta=0.1, dpo_label_smoothing=0.0, dpo_loss_type="sigmoid", pref_ftx=0.0,
                pipeline_model_parallel_size=1, context_parallel_size=1, mtp_num_layers=None,
                variable_seq_lengths_sft=False, data_path=[str(prefix)], train_data_path=None,
                valid_data_path=None, test_data_path=None, data_args_path=None, per_split_data_args_path=None,
                prompt_type=None)
    args.update(given)
    ns = argparse.Namespace(**args)
    PreferenceTraining().validate(ns, FeatureContext(backend=None, flags=argparse.Namespace(), explicit=set(given)))
    return ns


@pytest.mark.parametrize("given,named", [
    ({"hf_load_dir": None}, "has none: give --load"),
    ({"is_pairwise_dataset": False}, "--stage dpo trains on preference pairs"),
    ({"is_instruction_dataset": True}, "--stage dpo trains on preference pairs"),
    ({"data_path": ["/nonexistent/corpus"]}, "not a pairwise dataset"),
    ({"refer_model_iter": 3}, "--refer-model-iter"),
    ({"dpo_label_smoothing": 0.1, "dpo_loss_type": "ipo"}, "--dpo-label-smoothing applies"),
])
def test_dpo_refusals_are_one_sentence(tmp_path, given, named):
    from adaptor.features import ArgumentError

    with pytest.raises(ArgumentError, match=None) as caught:
        _validate(tmp_path, **given)
    message = str(caught.value)
    assert named in message and "\n" not in message, message


def test_a_complete_dpo_command_line_passes(tmp_path):
    assert _validate(tmp_path).refer_model_iter is None  # MindSpeed-LLM's default: the latest iteration
    assert _validate(tmp_path, hf_load_dir=None, lora_r=8).stage == "dpo"  # LoRA: the base is the reference
    assert _validate(tmp_path, pipeline_model_parallel_size=2, context_parallel_size=2).stage == "dpo"


@pytest.mark.parametrize("given,named", [
    ({"seq_length": 64}, "train with --seq-length 129 or more"),
    ({"pipeline_model_parallel_size": 4}, "middle pipeline stages (and virtual stages) receive no batch"),
    ({"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2}, "virtual stages) receive"),
    ({"pipeline_model_parallel_size": 2, "context_parallel_size": 2}, "needs --pipeline-model-parallel-size 1"),
])
def test_packed_pairs_refusals_are_one_sentence(tmp_path, given, named):
    """Samples packing several pairs (their summary says --pack, 130 tokens): a --seq-length that would cut
    the last pairs, and layouts where the pairs' boundaries cannot reach attention, are refused."""
    from adaptor.features import ArgumentError

    (tmp_path / "pairs_packed_meta.json").write_text(json.dumps({"pack": True, "seq_length": 130}))
    assert _validate(tmp_path, seq_length=129, pipeline_model_parallel_size=2).stage == "dpo"
    with pytest.raises(ArgumentError) as caught:
        _validate(tmp_path, **{"seq_length": 129, **given})
    message = str(caught.value)
    assert named in message and "\n" not in message, message


def test_resuming_dpo_needs_the_starting_model_as_reference(tmp_path):
    """A resumed policy is not the model the run started from: without --ref-model the reference would be
    the resumed weights, so the run is refused; --finetune (a new run) and --ref-model are accepted."""
    from adaptor.features import ArgumentError

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "latest_checkpointed_iteration.txt").write_text("6")
    with pytest.raises(ArgumentError) as caught:
        _validate(tmp_path, load=str(ckpt))
    assert "at iteration 6" in str(caught.value) and "--ref-model" in str(caught.value), caught.value
    assert _validate(tmp_path, load=str(ckpt), finetune=True).stage == "dpo"
    assert _validate(tmp_path, load=str(ckpt), lora_r=8, hf_load_dir=None).stage == "dpo"



def test_stored_reference_file_round_trip_and_refusals(tmp_path, monkeypatch):
    """--precompute-ref-logps's file reads back bit for bit, is written atomically, and a file made for
    another dataset or sequence length, a truncated one, or one given with --ref-model is refused."""
    from adaptor.features import ArgumentError
    from adaptor.preference import stored_reference as sr
    from adaptor.preference.pairwise_dataset import PairwiseDataset, PairwiseLowLevel

    preprocess = import_tool("preprocess_data")
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(json.dumps({**PAIR, "chosen": f"{k} apples", "rejected": "no"}) for k in range(3)) + "\n")
    common = ["--input", str(data), "--handler-name", "AlpacaStylePairwiseHandler", "--prompt-type", "qwen3",
              "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(SAMPLE_TOKENIZER)]
    assert preprocess.main([*common, "--output-prefix", str(tmp_path / "out")]) == 0
    same_lengths = data.read_text().replace(" apples", " pears")  # other tokens, every length kept
    longer = json.dumps({**PAIR, "chosen": "many more apples than before", "rejected": "no"})
    data.write_text(longer + "\n" + data.read_text())
    assert preprocess.main([*common, "--output-prefix", str(tmp_path / "other")]) == 0
    data.write_text(same_lengths)
    assert preprocess.main([*common, "--output-prefix", str(tmp_path / "pears")]) == 0
    pears = PairwiseLowLevel(str(tmp_path / "pears"))
    assert all(np.array_equal(f.sequence_lengths, pears.fields[n].sequence_lengths)
               for n, f in PairwiseLowLevel(str(tmp_path / "out")).fields.items()), "the test needs equal lengths"
    low = PairwiseLowLevel(str(tmp_path / "out"))
    values = torch.randn(3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64).numpy()
    path = str(tmp_path / "ref.logps")
    recorder = sr.Recorder(path, sr.header_for(low, 96))
    recorder.record(np.array([2, 0]), values[[2, 0]])
    with pytest.raises(sr.StoredReferenceError, match="complete pairs expected"):
        sr.write(path, recorder.header, recorder.values)  # pair 1 not seen yet: nothing written
    assert not (tmp_path / "ref.logps").exists()
    recorder.record(np.array([1]), values[[1]])
    sr.write(path, recorder.header, recorder.values)
    assert [p.name for p in tmp_path.iterdir() if "tmp" in p.name] == []
    header, back = sr.read(path)
    assert header["pairs"] == 3 and header["seq_length"] == 96 and np.array_equal(back, values)
    # the precomputing pass: data-parallel ranks share the samples in stored order, each as many
    # micro-batches, every pair exactly once (the padding sample's pairs marked absent)
    from adaptor.preference.precompute import micro_batches

    for mbs, parts in ((1, 1), (2, 2), (1, 2), (2, 3)):
        shares = [micro_batches(low, 96, 0, mbs, part, parts) for part in range(parts)]
        assert len({count for count, _ in shares}) == 1
        index = torch.cat([b["pair_index"][:, 0] for _, batches in shares for b in batches])
        assert sorted(i for i in index.tolist() if i >= 0) == [0, 1, 2], (mbs, parts, index)
        assert len(index) == shares[0][0] * parts * mbs
    # the sample index the training reads the file by is the stored pair's, whatever the epoch's order
    dataset = PairwiseDataset.__new__(PairwiseDataset)
    dataset.dataset, dataset.indices, dataset._epochs, dataset._pad = low, np.arange(3), {}, 0
    dataset.config = type("C", (), {"random_seed": 5, "sequence_length": 96})()
    for idx in range(6):
        index = dataset[idx]["pair_index"]
        assert int(index[0]) == int(dataset._order(idx // 3)[idx % 3]) and (index[1:] == -1).all()

    base = dict(data_path=[str(tmp_path / "out")], seq_length=96, split="100,0,0", train_iters=3,
                global_batch_size=1, tensor_model_parallel_size=1)
    assert _validate(tmp_path, ref_logps=path, hf_load_dir=None, **base).ref_logps == path
    refused = [({"seq_length": 64}, "--seq-length 96"), ({"data_path": [str(tmp_path / "other")]}, "pairs 3"),
               ({"data_path": [str(tmp_path / "pears")]}, "dataset digest"),
               ({"ref_model": str(tmp_path)}, "drop --ref-model")]
    for given, named in refused:
        with pytest.raises(ArgumentError) as caught:
            _validate(tmp_path, ref_logps=path, **{**base, **given})
        assert named in str(caught.value) and "\n" not in str(caught.value), caught.value
    # computed before the first step over every stored pair: any split or training length will do
    assert _validate(tmp_path, precompute_ref_logps=path + "2", **{**base, "split": "90,10,0", "train_iters": 1})
    with pytest.raises(ArgumentError) as caught:
        _validate(tmp_path, precompute_ref_logps=str(tmp_path / "missing" / "ref.logps"), **base)
    assert "does not exist or is not writable" in str(caught.value), caught.value
    # a field larger than the whole-file bound is read in spread blocks, which still see other tokens
    monkeypatch.setattr(sr, "_WHOLE_BYTES", 0)
    monkeypatch.setattr(sr, "_BLOCK_BYTES", 8)
    low_again = PairwiseLowLevel(str(tmp_path / "out"))
    assert sr.dataset_digest(low_again) == sr.dataset_digest(PairwiseLowLevel(str(tmp_path / "out")))
    assert sr.dataset_digest(low_again) != sr.dataset_digest(pears)
    monkeypatch.undo()
    older = tmp_path / "older.logps"
    older.write_bytes(open(path, "rb").read().replace(sr.FORMAT.encode(), b"dpo-reference-logps/1"))
    with pytest.raises(sr.StoredReferenceError, match="older version"):
        sr.read(str(older))
    with open(path, "r+b") as f:
        f.truncate(f.seek(0, 2) - 8)
    with pytest.raises(sr.StoredReferenceError, match="truncated"):
        sr.read(path)
