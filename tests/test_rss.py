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
from longbird.convert import default_source
from longbird.heads import LongBirdForSpanSelection
from longbird.training.rss import IGNORE_INDEX, QUESTION_TOKEN, RSSCollator, add_question_token, rss_example, \
    rss_examples
from longbird.workflows import rss_accuracy
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
