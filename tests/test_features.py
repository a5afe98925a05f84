"""QA windows on the real KorQuAD pages: answers labelled at the right tokens, windows covering the document."""

import json
from pathlib import Path

import pytest
from conftest import reading_tokenizer

from longbird.conversion import default_source
from longbird.data.features import label_window, make_features, resolve_doc_stride
from longbird.data.html import plain_document, preprocess_html

KORQUAD = Path(__file__).resolve().parents[1] / "data" / "korquad"


@pytest.fixture(scope="module")
def tokenizer():
    return reading_tokenizer(default_source())


def real_questions():
    for page in ("korquad2.1_dev_00.json", "korquad2.1_train_00.json"):
        record = json.loads((KORQUAD / page).read_text(encoding="utf-8"))["data"][0]
        for qa in record["qas"]:
            start = qa["answer"]["answer_start"]
            yield record["context"], qa, (start, start + len(qa["answer"]["text"]))


@pytest.mark.parametrize("max_length,doc_stride", [(256, 64), (512, 128), (1024, None)])
def test_every_window_holding_the_answer_labels_it_and_windows_cover_the_document(tokenizer, max_length, doc_stride):
    for context, qa, answer in real_questions():
        document = preprocess_html(context)
        target = document.from_source_span(*answer)
        features = make_features(tokenizer, qa["id"], qa["question"], document, max_length, doc_stride, answer)
        assert len(features) > 1 and all(len(f.input_ids) <= max_length for f in features)
        covered = set()
        labelled = 0
        for feature in features:
            spans = [o for o in feature.offsets if o is not None]
            covered.update(i for start, end in spans for i in range(start, end))
            holds_answer = spans[0][0] <= target[0] and target[1] <= spans[-1][1]
            if not holds_answer:
                assert (feature.start_position, feature.end_position) == (0, 0)
                continue
            labelled += 1
            s, e = feature.start_position, feature.end_position
            assert 0 < s <= e
            # The labelled tokens cover the answer and no token outside them is needed.
            assert feature.offsets[s][0] <= target[0] < feature.offsets[s][1]
            assert feature.offsets[e][0] < target[1] <= feature.offsets[e][1]
            text = document.text[feature.offsets[s][0]:feature.offsets[e][1]]
            assert document.text[target[0]:target[1]] in text
        assert labelled >= 1
        assert {i for i, ch in enumerate(document.text) if not ch.isspace()} <= covered
        # Neighbouring windows share doc_stride document tokens.
        stride = doc_stride if doc_stride is not None else resolve_doc_stride(
            tokenizer, max_length, None, _question_tokens(tokenizer, qa["question"]))
        first = [o for o in features[0].offsets if o is not None]
        second = [o for o in features[1].offsets if o is not None]
        assert first[-stride:] == second[:stride]


def _question_tokens(tokenizer, question):
    return len(tokenizer(question, add_special_tokens=False)["input_ids"])


def test_default_stride_is_half_a_window(tokenizer):
    """LittleBird A.2: any document longer than one window is read with a half-window stride (capped at half the
    room the question leaves), not 128 tokens until it passes two windows."""
    assert resolve_doc_stride(tokenizer, 1024, None, 10) == (1024 - 10 - 3) // 2
    assert resolve_doc_stride(tokenizer, 8192, None, 10) == 4089  # ~ the paper's 4K stride for 8K windows
    with pytest.raises(ValueError, match=r"doc_stride \(600\) must lie in 0\.\.498"):
        resolve_doc_stride(tokenizer, 512, 600, 10)
    with pytest.raises(ValueError, match="leave no room"):
        resolve_doc_stride(tokenizer, 12, None, 10)
    # A document of about 1.5 windows: two windows sharing half a window of document tokens.
    document = plain_document("대한민국 헌법 제1조 대한민국은 민주공화국이다. " * 40)
    features = make_features(tokenizer, "q", "무엇?", document, 128, None)
    first, second = ([o for o in f.offsets if o is not None] for f in features[:2])
    half = resolve_doc_stride(tokenizer, 128, None, _question_tokens(tokenizer, "무엇?"))
    assert len(features) >= 2 and half > 50 and first[-half:] == second[:half]


def test_token_types_for_a_tokenizer_that_emits_none(tokenizer):
    """RoBERTa-family tokenizers give no token type ids; a model with two types gets question 0, document 1."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, cls_token="[CLS]", sep_token="[SEP]",
                                   pad_token="[PAD]", unk_token="[UNK]", model_input_names=["input_ids", "attention_mask"])
    document = plain_document("대한민국은 민주공화국이다.")
    (without,) = make_features(fast, "q", "무엇?", document, 64, None)
    assert without.token_type_ids is None
    (feature,) = make_features(fast, "q", "무엇?", document, 64, None, token_types=True)
    (bert,) = make_features(tokenizer, "q", "무엇?", document, 64, None)
    assert feature.token_type_ids == bert.token_type_ids  # the same segments BERT's own tokenizer makes
    first_document = next(i for i, offset in enumerate(feature.offsets) if offset is not None)
    assert set(feature.token_type_ids[:first_document]) == {0} and set(feature.token_type_ids[first_document:]) == {1}


def test_truncation_keeps_the_first_window_only(tokenizer):
    context, qa, answer = next(real_questions())
    document = preprocess_html(context)
    all_windows = make_features(tokenizer, qa["id"], qa["question"], document, 256, 64, answer)
    first = make_features(tokenizer, qa["id"], qa["question"], document, 256, 64, answer, max_windows=1)
    assert len(first) == 1 and first[0].input_ids == all_windows[0].input_ids


def test_long_questions_are_cut(tokenizer):
    document = plain_document("짧은 문서입니다.")
    features = make_features(tokenizer, "q", "질문 " * 200, document, 128, 0, max_question_tokens=16)
    question_tokens = features[0].token_type_ids.count(0) - 2  # [CLS] question [SEP]
    assert 14 <= question_tokens <= 16


def test_label_window_by_hand():
    offsets = [None, None, (0, 2), (2, 4), (5, 8), None]
    assert label_window(offsets, (2, 6)) == (3, 4)
    assert label_window(offsets, (6, 9)) == (0, 0)  # runs past the window
    assert label_window([None, None], (0, 1)) == (0, 0)


def test_unreachable_answers_are_reported(tokenizer, caplog):
    document = preprocess_html("<div class='toc'>Seoul</div><p>capital Seoul</p>")
    with caplog.at_level("WARNING"):
        features = make_features(tokenizer, "toc-answer", "capital?", document, 64, 8, (17, 22))
    assert all(f.start_position == 0 for f in features) and "toc-answer" in caplog.text
    long_text = plain_document(" ".join(f"w{i}" for i in range(300)))
    start = long_text.text.index("w40 ")
    with caplog.at_level("WARNING"):
        make_features(tokenizer, "long-answer", "q", long_text, 64, 8, (start, start + 200))
    assert "long-answer" in caplog.text and "fits in no window" in caplog.text


@pytest.mark.parametrize("max_length, doc_stride", [(64, 0), (64, 30), (64, 38), (128, 100), (256, 128)])
def test_the_window_count_is_the_windows_made_and_a_limit_refuses_before_building_them(tokenizer, max_length,
                                                                                      doc_stride, monkeypatch):
    """`window_limit.window_count` from the document's token count equals the windows `make_features` builds (and
    `document_windows` for classification); over a limit `TooManyWindows` is raised before the tokenizer builds any
    window (the overflowing call never runs), at the limit the windows are built."""
    from longbird.data.classification import document_windows
    from longbird.data.window_limit import TooManyWindows, window_count

    for length in (3, 40, 200, 700):
        text = " ".join(f"단어{i}" for i in range(length))
        document = plain_document(text)
        question = "무엇이 가장 먼저 나오는가?"
        features = make_features(tokenizer, "q", question, document, max_length, doc_stride)
        room = max_length - _question_tokens(tokenizer, question) - tokenizer.num_special_tokens_to_add(pair=True)
        tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        assert window_count(tokens, room, doc_stride) == len(features)
        assert make_features(tokenizer, "q", question, document, max_length, doc_stride,
                             window_limit=len(features)) == features
        built = []
        original = type(tokenizer).__call__
        monkeypatch.setattr(type(tokenizer), "__call__", lambda self, *a, **k: built.append(
            k.get("return_overflowing_tokens", False)) or original(self, *a, **k))
        if len(features) > 1:
            with pytest.raises(TooManyWindows, match=f"make {len(features):,} windows of {max_length} tokens"):
                make_features(tokenizer, "q", question, document, max_length, doc_stride,
                              window_limit=len(features) - 1)
            assert built and not any(built)  # only the question and the document were counted
        monkeypatch.undo()
        single_room = max_length - tokenizer.num_special_tokens_to_add(pair=False)
        windows = document_windows(tokenizer, text, max_length, doc_stride)
        assert window_count(tokens, single_room, doc_stride) == len(windows)
        if len(windows) > 1:
            with pytest.raises(TooManyWindows):
                document_windows(tokenizer, text, max_length, doc_stride, window_limit=len(windows) - 1)


def test_answers_are_whole_characters_in_text_written_decomposed():
    """A normalising tokenizer gives the token 일 of NFD text (ᄋ ᅵ ᆯ) the offsets of its first jamo only: spans are
    widened to whole syllables (and combining marks), and never change in NFC text."""
    import unicodedata

    from longbird.data.features import whole_characters

    composed = "1989년 2월 15일 임종석"
    decomposed = unicodedata.normalize("NFD", composed)
    end_of_il = decomposed.index("15") + 3  # the token's end as the tokenizer reports it: after ᄋ
    begin, end = whole_characters(decomposed, decomposed.index("15"), end_of_il)
    assert unicodedata.normalize("NFC", decomposed[begin:end]) == "15일"
    start_in_syllable = decomposed.index("ᄋ", end) + 1  # a start on the vowel of 임 moves back to its consonant
    begin, end = whole_characters(decomposed, start_in_syllable, start_in_syllable + 1)
    assert unicodedata.normalize("NFC", decomposed[begin:end]) == "임"
    assert whole_characters(composed, 0, 4) == (0, 4) and whole_characters(composed, 11, 13) == (11, 13)
    accent = "cafe\u0301 noir"  # e + combining acute
    assert whole_characters(accent, 0, 4) == (0, 5) and whole_characters(accent, 4, 4) == (4, 4)  # empty stays
    family, thumb = "👨\u200d👩\u200d👧 가족", "👍🏽 좋다"  # a joiner sequence; a skin-tone modifier
    assert whole_characters(family, 0, 1) == (0, 5) and whole_characters(family, 2, 3) == (0, 5)
    assert whole_characters(thumb, 0, 1) == (0, 2)

