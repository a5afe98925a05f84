"""KorQuAD readers on the real files; malformed and mismatching records; the whole-article set and its split."""

import json
import logging
from pathlib import Path

import pytest

from longbird.data.korquad import (MalformedRecordError, as_squad_json, read_korquad_v1_articles, read_korquad_v2,
                                   read_squad_paragraphs, split_by_title)
from longbird.metrics.korquad import korquad_v1

KORQUAD = Path(__file__).resolve().parents[1] / "data" / "korquad"
PAGES = [KORQUAD / "korquad2.1_dev_00.json", KORQUAD / "korquad2.1_train_00.json"]


def test_reads_both_real_pages_with_exact_offsets():
    rows, skipped = read_korquad_v2(PAGES)
    assert skipped == [] and len(rows) == 3
    assert set(rows["title"]) == {"신대철", "T-X_프로그램"}
    for row in rows:
        text, start = row["answers"]["text"][0], row["answers"]["answer_start"][0]
        assert row["is_html"] and row["context"][start:start + len(text)] == text
    assert rows[1]["answers"]["text"] == ["<a>신중현</a>"]  # HTML answers are kept as in the file


def _page_copy(tmp_path, edit):
    record = json.loads(PAGES[0].read_text(encoding="utf-8"))
    edit(record["data"][0])
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
    return path


def test_offset_mismatch_is_reported_with_its_id_and_skipped(tmp_path, caplog):
    def shift(document):
        document["qas"][0]["answer"]["answer_start"] += 3

    with caplog.at_level(logging.WARNING):
        rows, skipped = read_korquad_v2(_page_copy(tmp_path, shift))
    assert [s.id for s in skipped] == ["66678"] and "not the answer '시나위'" in skipped[0].reason
    assert "66678" in caplog.text
    assert rows["id"] == ["57677"]


def test_missing_fields_name_the_record(tmp_path):
    def drop_answer(document):
        del document["qas"][1]["answer"]

    with pytest.raises(MalformedRecordError, match=r"57677.*missing field\(s\) \['answer'\]"):
        read_korquad_v2(_page_copy(tmp_path, drop_answer))
    with pytest.raises(ValueError, match="is a KorQuAD 1.0 / SQuAD file .* use --format korquad1"):
        read_korquad_v2(KORQUAD)  # the directory also holds the KorQuAD 1.0 file, which is not 2.x
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_korquad_v2(tmp_path / "absent.json")


SQUAD = {"version": "1.0", "data": [{"title": "T", "paragraphs": [
    {"context": "abc def", "qas": [{"id": "q1", "question": "what?", "answers": [{"text": "def", "answer_start": 4}]}]}]}]}


@pytest.mark.parametrize("damage, message", [
    (lambda d: d["paragraphs"][0]["qas"][0]["answers"][0].pop("text"), r"q1 \(article 'T'\): answers\[0\]: missing "
                                                                        r"field\(s\) \['text'\]"),
    (lambda d: d["paragraphs"][0]["qas"][0].update(answers={"text": "def"}), "q1 .*answers is a JSON object, not an "
                                                                              "array"),
    (lambda d: d["paragraphs"][0].update(context=None), "paragraph 0 of article 'T': context is a JSON null, not a "
                                                        "string"),
    (lambda d: d["paragraphs"][0]["qas"].__setitem__(0, "q1"), r"\? \(article 'T'\): a JSON string where an object"),
    (lambda d: d.update(paragraphs={}), r"data\[0\] \(article 'T'\).*paragraphs is a JSON object, not an array"),
])
@pytest.mark.parametrize("reader", [read_korquad_v1_articles, read_squad_paragraphs])
def test_malformed_squad_records_are_named_with_the_fix(tmp_path, damage, message, reader):
    """Each gave a bare KeyError ('text'), TypeError or AttributeError from the reader."""
    import copy
    import json

    data = copy.deepcopy(SQUAD)
    damage(data["data"][0])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(MalformedRecordError, match=message + ".*; fix or remove that record"):
        reader(path)


def test_a_squad_answer_start_that_is_not_an_integer_skips_its_record(tmp_path):
    import copy
    import json

    data = copy.deepcopy(SQUAD)
    data["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = "4"
    path = tmp_path / "start.json"
    path.write_text(json.dumps(data))
    rows, skipped = read_korquad_v1_articles(path)
    assert len(rows) == 0 and skipped[0].id == "q1" and "answer_start '4' is not a non-negative integer" in skipped[0].reason


def test_korquad1_whole_articles_keep_every_answer_at_its_shifted_offset():
    rows, skipped = read_korquad_v1_articles(KORQUAD / "KorQuAD_v1.0_dev.json")
    assert skipped == [] and len(rows) == 5774 and len(set(rows["title"])) == 140
    for row in rows:
        for text, start in zip(row["answers"]["text"], row["answers"]["answer_start"]):
            assert row["context"][start:start + len(text)] == text
    lengths = sorted(len(c) for c in set(rows["context"]))
    assert lengths[-1] > 40_000  # real long documents
    # Round trip through the official format: gold answers score 100.
    assert korquad_v1({r["id"]: r["answers"]["text"][0] for r in rows}, as_squad_json(rows))["exact_match"] == 100.0


def test_korquad1_paragraphs_are_the_published_contexts_and_split_like_the_articles():
    rows, skipped = read_squad_paragraphs(KORQUAD / "KorQuAD_v1.0_dev.json")
    raw = json.loads((KORQUAD / "KorQuAD_v1.0_dev.json").read_text(encoding="utf-8"))
    paragraphs = {p["context"] for a in raw["data"] for p in a["paragraphs"] if p["qas"]}  # one has none
    assert skipped == [] and len(rows) == 5774 and set(rows["context"]) == paragraphs
    first = raw["data"][0]["paragraphs"][0]["qas"][0]
    row = rows[0]
    assert row["id"] == first["id"] and row["answers"]["answer_start"] == [a["answer_start"] for a in first["answers"]]
    articles, _ = read_korquad_v1_articles(KORQUAD / "KorQuAD_v1.0_dev.json")
    # The paragraph set splits into the same articles, so a model trained on train paragraphs never saw dev ones.
    assert split_by_title(rows)["dev"]["id"] == split_by_title(articles)["dev"]["id"]


def test_split_is_by_article_and_reproducible():
    rows, _ = read_korquad_v1_articles(KORQUAD / "KorQuAD_v1.0_dev.json")
    split = split_by_title(rows, dev_fraction=0.2, seed=0)
    train_titles, dev_titles = set(split["train"]["title"]), set(split["dev"]["title"])
    assert not train_titles & dev_titles and len(dev_titles) == 28
    assert len(split["train"]) + len(split["dev"]) == len(rows)
    assert split_by_title(rows, 0.2, seed=0)["dev"]["id"] == split["dev"]["id"]
    assert split_by_title(rows, 0.2, seed=1)["dev"]["id"] != split["dev"]["id"]


def test_max_examples_draws_a_seeded_sample_across_articles():
    from longbird.tasks.qa import sample_questions

    rows, _ = read_squad_paragraphs(KORQUAD / "KorQuAD_v1.0_dev.json")
    train = split_by_title(rows)["train"]
    sample = sample_questions(train, 200, seed=0)
    assert len(sample) == 200 and sample["id"] == sample_questions(train, 200, seed=0)["id"]
    assert sample["id"] != sample_questions(train, 200, seed=1)["id"]
    # The first 200 questions come from a handful of articles; a drawn sample covers most of them.
    assert len(set(sample["title"])) > 3 * len(set(train.select(range(200))["title"]))
    assert sample_questions(train, None) is train and len(sample_questions(train, 10**6)) == len(train)
