"""Lazy QA training windows (data/windows.py) are the eager ones: the same ids, token types and labels, in the same
order, after the same negative draw; on real KorQuAD 2.1 pages (HTML) and whole KorQuAD 1.0 articles, with a BERT
(WordPiece, token types) and an XLM-R (SentencePiece, no token types) tokenizer."""

from pathlib import Path

import numpy as np
import pytest
from conftest import reading_tokenizer

from longbird.conversion import default_source
from longbird.data.features import features_for_rows, label_window
from longbird.data.korquad import read_korquad_v1_articles, read_korquad_v2
from longbird.data.windows import PairTemplate, QAWindows, label_range, window_ranges
from longbird.sources import e5_path
from longbird.training.finetune import qa_training_items

KORQUAD = Path(__file__).resolve().parents[1] / "data" / "korquad"


@pytest.fixture(scope="module", params=["bert", "xlm-r"])
def tokenizer(request):
    return reading_tokenizer(default_source() if request.param == "bert" else e5_path())


@pytest.fixture(scope="module")
def pages():
    rows = [read_korquad_v2(KORQUAD / page)[0] for page in ("korquad2.1_dev_00.json", "korquad2.1_train_00.json")]
    return [row for dataset in rows for row in dataset]


@pytest.fixture(scope="module")
def articles():
    rows = read_korquad_v1_articles(KORQUAD / "KorQuAD_v1.0_dev.json")[0]
    return [rows[i] for i in range(0, 400, 7)]  # 58 questions over several whole articles


def _eager(tokenizer, rows, length, stride, negative_fraction, seed, token_types, max_windows=None):
    features = features_for_rows(tokenizer, rows, length, stride, max_windows, token_types=token_types)
    return features, qa_training_items(features, negative_fraction, seed)


@pytest.mark.parametrize("length, stride, negative_fraction, token_types", [
    (256, 64, 1.0, False), (512, None, 0.1, True), (384, 100, 0.3, False)])
def test_lazy_windows_equal_the_eager_items(tokenizer, pages, articles, length, stride, negative_fraction,
                                            token_types):
    for rows in (pages, articles):
        features, eager = _eager(tokenizer, rows, length, stride, negative_fraction, 5, token_types)
        lazy = QAWindows(tokenizer, rows, length, stride, negative_fraction=negative_fraction, seed=5,
                         token_types=token_types)
        assert lazy.windows == len(features) and len(lazy) == len(eager)
        assert sum(item["start_positions"] > 0 for item in eager) > 0  # answers are labelled, not only negatives
        for index, item in enumerate(eager):
            assert lazy[index] == item, index
        assert lazy.lengths() == [len(item["input_ids"]) for item in eager]


def test_truncation_keeps_the_first_window_only(tokenizer, articles):
    features, eager = _eager(tokenizer, articles, 256, 32, 1.0, 0, False, max_windows=1)
    lazy = QAWindows(tokenizer, articles, 256, 32, max_windows=1)
    assert lazy.windows == len(features) == len(articles)
    assert [lazy[i] for i in range(len(lazy))] == eager


def test_memory_holds_each_document_once(tokenizer, articles):
    """Many questions over few articles: one tokenized copy per article, a few integers per window."""
    lazy = QAWindows(tokenizer, articles, 256, 64)
    assert len(lazy.documents) == len({row["context"] for row in articles}) < len(articles)
    assert lazy.items.nbytes == len(lazy) * 6 * 8


def test_window_ranges_follow_the_overflow_rule():
    assert window_ranges(5, 10, 3) == [(0, 5)]
    assert window_ranges(10, 4, 1) == [(0, 4), (3, 7), (6, 10)]
    assert window_ranges(11, 4, 1) == [(0, 4), (3, 7), (6, 10), (9, 11)]
    assert window_ranges(10, 4, 0) == [(0, 4), (4, 8), (8, 10)]


def test_label_range_is_label_window_without_the_specials():
    rng = np.random.default_rng(0)
    for _ in range(200):
        starts = np.sort(rng.integers(0, 60, 12))
        offsets = np.stack([starts, starts + rng.integers(0, 4, 12)], axis=1)  # some empty (zero-width) tokens
        target = tuple(sorted(rng.integers(0, 64, 2).tolist()))
        window = [None, None] + [tuple(o) for o in offsets.tolist()] + [None]  # [CLS] q [SEP] ... [SEP]
        expected = label_window(window, target)
        found = label_range(offsets, target)
        assert (expected == (0, 0) and found is None) or expected == (found[0] + 2, found[1] + 2), (offsets, target)


def test_pair_template_is_the_tokenizers_pair_encoding(tokenizer):
    template = PairTemplate.of(tokenizer)
    question = tokenizer("질문은 무엇인가", add_special_tokens=False)["input_ids"]
    window = np.asarray(tokenizer("문서의 한 부분", add_special_tokens=False)["input_ids"])
    pair = tokenizer("질문은 무엇인가", "문서의 한 부분")
    item = template.assemble(question, window, pair_token_types=False)
    assert item["input_ids"] == pair["input_ids"]
    assert item.get("token_type_ids") == pair.get("token_type_ids")


def test_unreachable_answers_are_reported_as_the_eager_route_does(tokenizer, caplog):
    toc = "<div class='toc'>Seoul</div><p>capital Seoul</p>"
    words = " ".join(f"w{i}" for i in range(300))
    start = words.index("w40 ")
    rows = [{"id": "toc-answer", "question": "capital?", "context": toc, "is_html": True,
             "answers": {"text": ["Seoul"], "answer_start": [17]}},
            {"id": "long-answer", "question": "q", "context": words, "is_html": False,
             "answers": {"text": [words[start:start + 200]], "answer_start": [start]}}]
    with caplog.at_level("WARNING"):
        lazy = QAWindows(tokenizer, rows, 64, 8)
    assert all(lazy[i]["start_positions"] == 0 for i in range(len(lazy)))
    assert "toc-answer" in caplog.text and "dropped by preprocessing" in caplog.text
    assert "long-answer" in caplog.text and "fits in no window" in caplog.text


class _KnownLengths:
    """A dataset whose items the sampler must never build: it reads `lengths()` (as QAWindows offers)."""

    def __init__(self, lengths):
        self._lengths = lengths

    def __len__(self):
        return len(self._lengths)

    def __getitem__(self, index):
        raise AssertionError("the length-grouped sampler built an item to measure it")

    def lengths(self):
        return self._lengths


def test_length_grouped_batches_come_from_the_datasets_own_lengths(tmp_path):
    """--group-by-length: batches of similar lengths (little padding) drawn from `lengths()`, every item once."""
    import torch
    from transformers import TrainingArguments

    import longbird
    from longbird.training.trainer import LongBirdTrainer

    from conftest import make_source

    generator = np.random.default_rng(0)
    lengths = generator.integers(20, 513, 800).tolist()
    model = longbird.convert(make_source("bert"), preset="full", max_length=512)
    batch = 16

    def padding_ratio(order):
        batches = [[lengths[i] for i in order[k:k + batch]] for k in range(0, len(order), batch)]
        return sum(max(b) * len(b) for b in batches) / sum(lengths)

    ratios = {}
    for strategy in ("random", "group_by_length"):
        arguments = TrainingArguments(output_dir=str(tmp_path / strategy), per_device_train_batch_size=batch,
                                      use_cpu=True, report_to=[], train_sampling_strategy=strategy)
        dataset = _KnownLengths(lengths) if strategy == "group_by_length" else list(range(len(lengths)))
        trainer = LongBirdTrainer(model=model, args=arguments, train_dataset=dataset)
        torch.manual_seed(0)
        order = list(trainer._get_train_sampler())
        assert sorted(order) == list(range(len(lengths)))
        ratios[strategy] = padding_ratio(order)
    # uniform lengths in 20..512: a random batch of 16 pads to ~483 against a mean of 266 (ratio ~1.8)
    assert ratios["group_by_length"] < 1.15 and ratios["random"] > 1.5, ratios
