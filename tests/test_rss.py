"""Recurring Span Selection (issue 12): labels point at the kept span, every [QUESTION] has one, spans are whole
words; the span-selection head learns; `longbird pretrain` runs end to end."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoTokenizer
from typer.testing import CliRunner

import longbird
from longbird.cli import app
from longbird.conversion import default_source
from longbird.heads import LongBirdForSpanSelection
from longbird.training.rss import IGNORE_INDEX, QUESTION_TOKEN, RSSCollator, add_question_token, rss_example, \
    rss_examples
from longbird.tasks.pretraining import rss_accuracy
from conftest import BLOCK, make_source
from test_qa_cli import tiny_source  # noqa: F401  (fixture)

runner = CliRunner()
TEXT = ("The national assembly passed the budget act. The budget act funds public schools. "
        "Public schools in Seoul received the budget act funds, and the national assembly approved them again.")


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = AutoTokenizer.from_pretrained(default_source(), local_files_only=True)
    add_question_token(tokenizer)
    return tokenizer


def test_labels_point_at_the_kept_span_of_whole_words(tokenizer):
    encoding = tokenizer(TEXT)
    ids, word_ids = encoding["input_ids"], encoding.word_ids()
    question = tokenizer.convert_tokens_to_ids(QUESTION_TOKEN)
    example = rss_example(ids, word_ids, tokenizer, question, random.Random(0))
    assert example is not None and example.question_positions
    assert [i for i, token in enumerate(example.input_ids) if token == question] == example.question_positions
    original = tokenizer.decode(ids)
    for start, end in zip(example.start_positions, example.end_positions):
        span = tokenizer.decode(example.input_ids[start:end + 1])
        assert original.count(span) >= 2  # it recurred in the original text
        assert question not in example.input_ids[start:end + 1] and end - start + 1 <= 10
        # Whole words: the span starts a word and the token after it starts the next one.
        assert not tokenizer.convert_ids_to_tokens(example.input_ids[start]).startswith("##")
        assert not tokenizer.convert_ids_to_tokens(example.input_ids[end + 1]).startswith("##")
    # Questions replace the other occurrences: the sequence got shorter by the replaced tokens.
    assert len(example.input_ids) < len(ids)


def test_korean_spans_are_whole_words(tokenizer):
    text = "대한민국 국회는 예산안을 의결한다. 국회는 예산안을 심사한다. 대한민국 국회는 법률안을 심사한다."
    items = rss_examples([text], tokenizer, 128)
    (item,) = items
    question = tokenizer.convert_tokens_to_ids(QUESTION_TOKEN)
    assert all(item["input_ids"][q] == question for q in item["question_positions"])
    for start, end in zip(item["start_positions"], item["end_positions"]):
        assert not tokenizer.convert_ids_to_tokens(item["input_ids"][start]).startswith("##")
        nxt = tokenizer.convert_ids_to_tokens(item["input_ids"][end + 1])
        assert not nxt.startswith("##")


def test_span_selection_head_learns_and_accuracy_counts_exact_spans(tokenizer):
    source = make_source("bert")
    base = longbird.convert(source, preset="littlebird", max_length=256, block_size=BLOCK, pack_size=4)
    model = LongBirdForSpanSelection(base.config)
    model.longbird.load_state_dict(base.state_dict())
    rng = random.Random(0)
    items = []
    for _ in range(4):  # synthetic windows: ids below the tiny vocabulary, two recurring spans each
        span = [rng.randrange(10, 90) for _ in range(3)]
        ids = [2] + [rng.randrange(10, 90) for _ in range(20)] + span + [rng.randrange(10, 90) for _ in range(20)] + [3]
        question = 30  # after the span (tokens 21..23), so the span keeps its place
        ids.insert(question, 7)
        start = 21
        items.append({"input_ids": ids, "attention_mask": [1] * len(ids), "question_positions": [question],
                      "start_positions": [start], "end_positions": [start + 2]})
    batch = RSSCollator(0)(items)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    losses = []
    for _ in range(30):
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0]
    assert rss_accuracy(model, items) == 100.0
    padded = RSSCollator(0)(items[:1] + [dict(items[1], question_positions=[], start_positions=[], end_positions=[])])
    assert (padded["start_positions"][1] == IGNORE_INDEX).all()


def test_pretrain_command_runs_end_to_end(tiny_source, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT * 6)
    other = tmp_path / "held.txt"
    other.write_text(TEXT * 3)
    result = runner.invoke(app, ["pretrain", "--model", str(tiny_source), "--preset", "littlebird", "--max-length",
                                 "256", "--corpus", str(other), "--corpus", str(corpus), "--length", "128",
                                 "--max-steps", "2", "--batch-size", "2", "--save-steps", "1",
                                 "--output-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    model = LongBirdForSpanSelection.from_pretrained(tmp_path / "run" / "model")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "run" / "model")
    assert QUESTION_TOKEN in tokenizer.get_vocab() and model.get_input_embeddings().weight.shape[0] == len(tokenizer)
    assert (tmp_path / "run" / "checkpoints" / "checkpoint-2").is_dir()


def test_default_corpus_holds_out_the_korquad_dev_split_articles():
    """The default corpus: KorQuAD 1.0 train-split articles, KorQuAD 2.1 pages (visible text), TyDi QA Korean and the
    packaged laws and bills for training; exactly the dev-split articles (those `finetune-qa --split dev` scores)
    held out; no attribution file read as text."""
    from longbird.data.corpus import REPOSITORY_DATA, corpus_split, default_corpus, default_corpus_titled
    from longbird.data.korquad import read_korquad_v1_articles, split_by_title

    training, held = default_corpus()
    split = split_by_title(read_korquad_v1_articles(REPOSITORY_DATA / "korquad" / "KorQuAD_v1.0_dev.json")[0])
    assert set(held) == set(split["dev"]["context"]) and len(held) == len(set(split["dev"]["title"]))
    assert not set(held) & set(training) and set(split["train"]["context"]) <= set(training)
    assert any(text.startswith("대한민국헌법") for text in training)  # the constitution (packaged laws)
    assert any("도라에몽" in text[:200] for text in training) and any("지존파" in text[:200] for text in training)
    assert any(text.startswith("신대철") for text in training)  # KorQuAD 2.1 page, HTML gone
    assert not any("<td" in text or "<p>" in text for text in training)
    assert not any("SOURCE" in text[:40] or "Repository:" in text for text in training)
    # held_out=0 scores nothing and still never trains on the held-out articles (E5 once trained on them)
    assert corpus_split(None, held_out=0) == (training, [])
    titled_training, titled_held = default_corpus_titled()
    assert [title for title, _ in titled_held] == list(dict.fromkeys(split["dev"]["title"]))
    assert not {title for title, _ in titled_training} & {title for title, _ in titled_held}
    assert "constitution" in {title for title, _ in titled_training}


def test_pretrain_with_tape_peft_saves_only_what_was_trained(tiny_source, tmp_path):
    """`pretrain --preset tape --peft tape`: only the TAPE maps, the span-selection head and the [QUESTION] row are
    written; the directory loads back into the full model (base converted again) with those tensors."""
    from safetensors.torch import load_file

    from longbird.checkpoints import load_task_model

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT * 6)
    out = tmp_path / "run"
    result = runner.invoke(app, ["pretrain", "--model", str(tiny_source), "--preset", "tape", "--max-length", "256",
                                 "--corpus", str(corpus), "--length", "128", "--max-steps", "2", "--batch-size", "2",
                                 "--save-steps", "0", "--peft", "tape", "--learning-rate", "1e-2",
                                 "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    saved = load_file(str(out / "model" / "tape_peft.safetensors"))
    assert not (out / "model" / "model.safetensors").exists()
    assert all("tape_" in n or n.startswith(("start_query", "end_query")) or n == "added_word_embeddings"
               for n in saved), sorted(saved)
    assert saved["added_word_embeddings"].shape[0] == 1  # the [QUESTION] row
    model, tokenizer = load_task_model(out / "model", LongBirdForSpanSelection)
    assert QUESTION_TOKEN in tokenizer.get_vocab() and model.get_input_embeddings().weight.shape[0] == len(tokenizer)
    restored = dict(model.named_parameters())
    for name, tensor in saved.items():
        if name != "added_word_embeddings":
            torch.testing.assert_close(restored[name], tensor)
    assert any(restored[n].abs().max() > 0 for n in restored if "tape_post" in n)  # trained away from zero


@pytest.mark.parametrize("spare_rows", [0, 7])
def test_question_token_row_is_the_mean_embedding_and_the_table_never_shrinks(spare_rows):
    """[QUESTION] gets the mean of the vocabulary's rows whether it lands past the table (MiniLM) or in one of the
    spare rows past the tokenizer (multilingual-e5-small has 35); the table keeps at least its size."""
    from transformers import BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(default_source(), local_files_only=True)
    pieces = len(tokenizer)
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=pieces + spare_rows, hidden_size=8, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=8))
    with torch.no_grad():  # spare rows far from the vocabulary: a mean over them would show
        model.get_input_embeddings().weight[pieces:] = 100.0
    before = model.get_input_embeddings().weight.detach().clone()
    question = add_question_token(tokenizer, model)
    table = model.get_input_embeddings().weight.detach()
    assert question == pieces and table.shape[0] == max(pieces + 1, pieces + spare_rows)
    torch.testing.assert_close(table[question], before[:pieces].mean(0), rtol=0, atol=1e-6)
    torch.testing.assert_close(table[:pieces], before[:pieces], rtol=0, atol=0)
    torch.testing.assert_close(table[pieces + 1:], before[pieces + 1:], rtol=0, atol=0)  # other spare rows untouched
    assert add_question_token(tokenizer, model) == question and model.get_input_embeddings().weight.shape == table.shape


def test_pretrain_on_a_one_document_corpus_says_that_nothing_is_held_out(tiny_source, tmp_path, caplog):
    import logging

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT * 6)
    with caplog.at_level(logging.WARNING, logger="longbird"):
        result = runner.invoke(app, ["pretrain", "--model", str(tiny_source), "--preset", "littlebird", "--max-length",
                                     "256", "--corpus", str(corpus), "--length", "128", "--max-steps", "1",
                                     "--batch-size", "2", "--output-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "nothing of the corpus is held out" in caplog.text and "no held-out RSS accuracy" in caplog.text
