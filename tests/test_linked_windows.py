"""Linked windows (linked_windows.py, E7 round 13): at zero gates a linked reader reads exactly as unlinked; the
exchange equals a loop over the rows of each document; rows of other documents never matter; the gates get a
gradient at zero; the cross-window ranking loss equals its loop; grouped training data, reading a question's windows
in one batch, reconversion and `finetune-qa --linked-windows` end to end with their refusals."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import BLOCK, VOCAB, assert_loss_equals_loop, korquad1_dev_questions, make_source
from test_qa_cli import tiny_qa, tiny_source  # noqa: F401  (fixtures)

import longbird
from longbird.conversion import reconvert
from longbird.data.window_groups import LinkedBatches, WindowGroups
from longbird.heads import IGNORE_INDEX, LongBirdForQuestionAnswering
from longbird.linked_windows import cross_window_ranking_loss, linked_rows


def linked_reader(seed: int = 0, linked: bool = True, **config) -> LongBirdForQuestionAnswering:
    base = longbird.convert(make_source("bert", seed=seed), max_length=256, block_size=BLOCK)
    torch.manual_seed(seed)
    model = LongBirdForQuestionAnswering(base.config.__class__(**{**base.config.to_dict(),
                                                                  "linked_windows": linked, **config}))
    model.longbird.load_state_dict(base.state_dict(), strict=False)
    return model.eval()


def windows(lengths=(40, 40, 23, 40, 17), seed: int = 0):
    """Rows of [CLS]-like id 2 then random ids, right-padded: two documents (rows 0-2 and 3-4)."""
    generator = torch.Generator().manual_seed(seed)
    longest = max(lengths)
    ids = torch.randint(5, VOCAB, (len(lengths), longest), generator=generator)
    ids[:, 0] = 2
    mask = torch.zeros(len(lengths), longest, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
        ids[row, length:] = 0
    return ids, mask, torch.tensor([0, 0, 0, 1, 1])


def set_gates(model, value: float = 0.7):
    with torch.no_grad():
        model.longbird.encoder.links.gates.fill_(value)


def test_at_zero_gates_a_linked_reader_reads_exactly_as_unlinked():
    ids, mask, documents = windows()
    linked, unlinked = linked_reader(), linked_reader(linked=False)
    assert not linked.longbird.encoder.links.gates.any()
    got = linked(ids, mask, document_ids=documents)
    expected = unlinked(ids, mask)
    assert torch.equal(got.start_logits, expected.start_logits)
    assert torch.equal(got.end_top_logits, expected.end_top_logits)


def _loop_exchange(layer, hidden, documents, gate):
    """Written out: each row's [CLS] reads the [CLS] of the other rows of its document, per head, with the layer's
    own projections; O's output scaled by the gate and added; a row with no other row is unchanged."""
    attention = layer.attention.self
    heads, size = attention.num_heads, attention.head_dim
    out = hidden.clone()
    for row in range(hidden.shape[0]):
        others = [j for j in range(hidden.shape[0]) if j != row and documents[j] == documents[row]]
        if not others:
            continue
        contexts = []
        for head in range(heads):
            part = slice(head * size, (head + 1) * size)
            query = attention.query(hidden[row, 0])[part]
            keys = torch.stack([attention.key(hidden[j, 0])[part] for j in others])
            values = torch.stack([attention.value(hidden[j, 0])[part] for j in others])
            weights = torch.softmax(keys @ query / math.sqrt(size), 0)
            contexts.append(weights @ values)
        out[row, 0] = hidden[row, 0] + gate * layer.attention.output.dense(torch.cat(contexts))
    return out


def test_the_exchange_equals_a_loop_over_each_documents_rows():
    model = linked_reader()
    links, layer = model.longbird.encoder.links, model.longbird.encoder.layer[1]
    set_gates(model, 0.7)
    hidden = torch.randn(5, 12, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    documents = torch.tensor([0, 1, 0, 0, 2])  # row 4 alone
    got = links(1, layer, hidden, documents)
    # fp32 products of hidden size 32 and softmaxes over at most 2 keys: rounding of order 1e-6 at values of order 1
    torch.testing.assert_close(got, _loop_exchange(layer, hidden, documents, 0.7), rtol=0, atol=1e-5)
    assert torch.equal(got[4], hidden[4]) and torch.equal(got[:, 1:], hidden[:, 1:])
    assert torch.equal(linked_rows(documents), torch.tensor(
        [[0, 0, 1, 1, 0], [0, 0, 0, 0, 0], [1, 0, 0, 1, 0], [1, 0, 1, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool))


def test_a_document_reads_the_same_alone_or_beside_another_and_its_own_windows_matter():
    ids, mask, documents = windows()
    model = linked_reader()
    set_gates(model, 0.7)
    together = model(ids, mask, document_ids=documents).start_logits
    alone = model(ids[:3], mask[:3], document_ids=documents[:3]).start_logits
    # the rows' own attention is independent of the batch (tests/test_batch_independence.py); the exchange reads only
    # the document's rows: the same fp32 products in another batch shape, rounding of order 1e-6
    torch.testing.assert_close(together[:3, :40], alone[:, :40], rtol=0, atol=1e-5)
    # Window 0 reads window 1's [CLS] state. (A random tiny encoder's [CLS] state hardly depends on its window's
    # tokens, 0.005 for a new window, so the [CLS] token itself is changed to make the state move.)
    changed = ids.clone()
    changed[1, 0] = 7
    states = model.longbird(ids, mask, document_ids=documents).last_hidden_state
    moved = model.longbird(changed, mask, document_ids=documents).last_hidden_state
    assert (moved[0] - states[0]).abs().max() > 1e-2 and (moved[2] - states[2]).abs().max() > 1e-2
    torch.testing.assert_close(moved[3:], states[3:], rtol=0, atol=1e-5)  # the other document does not
    unlinked = model(ids, mask).start_logits  # no document ids: no row is linked
    assert torch.equal(unlinked, linked_reader(linked=False)(ids, mask).start_logits)


def test_the_gates_learn_from_zero():
    ids, mask, documents = windows()
    model = linked_reader(qa_ranking_weight=0.5).train()
    out = model(ids, mask, document_ids=documents, start_positions=torch.tensor([7, 0, 0, 0, 3]),
                end_positions=torch.tensor([9, 0, 0, 0, 4]))
    out.loss.backward()
    assert model.longbird.encoder.links.gates.grad.abs().min() > 0


def _loop_ranking(logits, valid, targets, documents):
    """Written out: per document with the answer, a cross-entropy over [z_w(t) - z_w(0) for every real t > 0 of every
    window w] + [0], the gold starts' probabilities summed."""
    losses = []
    for document in documents.unique().tolist():
        rows = [r for r in range(len(documents)) if documents[r] == document]
        scores, gold = [], []
        for row in rows:
            for t in range(1, logits.shape[1]):
                if valid[row, t]:
                    if int(targets[row]) == t:
                        gold.append(len(scores))
                    scores.append(logits[row, t] - logits[row, 0])
        if not gold:
            continue
        scores = torch.stack(scores + [logits.new_zeros(())])
        losses.append(torch.logsumexp(scores, 0) - torch.logsumexp(scores[gold], 0))
    return torch.stack(losses).mean()


def test_the_cross_window_ranking_loss_equals_its_loop_with_its_gradients():
    generator = torch.Generator().manual_seed(3)
    logits = (3 * torch.randn(6, 20, generator=generator)).requires_grad_()
    valid = torch.ones(6, 20, dtype=torch.bool)
    valid[2, 12:] = False
    valid[5, 9:] = False
    documents = torch.tensor([4, 4, 4, 7, 7, 9])  # the answer twice in document 4 (overlapping windows)
    targets = torch.tensor([5, 0, 3, 0, 0, IGNORE_INDEX])  # document 7 has no answer, 9 an ignored row
    got = cross_window_ranking_loss(logits, valid, targets, documents)
    assert_loss_equals_loop(got, _loop_ranking(logits, valid, targets, documents), logits, valid)
    none = cross_window_ranking_loss(logits, valid, torch.zeros(6, dtype=torch.long), documents)
    assert none.item() == 0 and none.requires_grad


def test_the_model_mixes_the_window_and_ranking_losses_by_its_weight():
    ids, mask, documents = windows()
    model = linked_reader(qa_ranking_weight=0.25)
    starts, ends = torch.tensor([7, 0, 0, 0, 3]), torch.tensor([9, 0, 0, 0, 4])
    out = model(ids, mask, document_ids=documents, start_positions=starts, end_positions=ends)
    valid = mask.bool()
    start = (0.75 * torch.nn.functional.cross_entropy(out.start_logits.float(), starts)
             + 0.25 * cross_window_ranking_loss(out.start_logits, valid, starts, documents))
    end = torch.nn.functional.cross_entropy(out.end_logits.float(), ends)
    # the same fp32 terms summed in another order: rounding of order 1e-6
    torch.testing.assert_close(out.loss, (start + end) / 2, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="LittleBird"):
        longbird.convert(make_source("bert"), preset="littlebird", max_length=256, block_size=BLOCK,
                         linked_windows=True)


def test_reconvert_adds_the_gates_at_zero_and_drops_them():
    unlinked = linked_reader(linked=False, seed=2)
    linked = reconvert(unlinked, linked_windows=True)
    assert linked.config.linked_windows and not linked.longbird.encoder.links.gates.any()
    ids, mask, documents = windows()
    assert torch.equal(linked(ids, mask, document_ids=documents).start_logits, unlinked(ids, mask).start_logits)
    back = reconvert(linked, linked_windows=False)
    assert not hasattr(back.longbird.encoder, "links")


@pytest.fixture(scope="module")
def e5_windows():
    from conftest import reading_tokenizer

    from longbird.data.windows import QAWindows
    from longbird.sources import e5_path

    tokenizer = reading_tokenizer(e5_path())
    return QAWindows(tokenizer, korquad1_dev_questions(40), 128, 32, negative_fraction=1.0, seed=0)


def test_a_group_holds_its_questions_answer_windows_and_others_of_its_document(e5_windows):
    groups = WindowGroups(e5_windows, 4, seed=1)
    items = e5_windows.items
    questions = items[:, 0]
    assert len(groups) + groups.skipped == len(set(questions.tolist()))
    for group in groups.groups:
        assert len(group) <= 4 and group == sorted(group)
        assert len({int(questions[i]) for i in group}) == 1  # one question
        question = int(questions[group[0]])
        mine = [i for i in range(len(items)) if questions[i] == question]
        answered = [i for i in mine if items[i, 4] > 0]
        assert answered and set(answered[:4]) <= set(group)
        assert len(group) == min(4, len(mine)) if len(answered) <= 4 else len(group) == 4
    lengths = groups.lengths()
    assert lengths[0] == sum(len(e5_windows[i]["input_ids"]) for i in groups.groups[0])
    batch = LinkedBatches(0)([groups[0], groups[1]])
    assert batch["document_ids"].tolist() == [0] * len(groups.groups[0]) + [1] * len(groups.groups[1])
    assert batch["input_ids"].shape[0] == len(groups.groups[0]) + len(groups.groups[1])
    with pytest.raises(ValueError, match="at least one window"):
        WindowGroups(e5_windows, 0)


def bm25(query: list[int], texts: list[list[int]], k1: float = 1.5, b: float = 0.75, epsilon: float = 0.25):
    """Okapi BM25 written out (Robertson & Zaragoza 2009, eq. 3.18's saturation with document-length normalisation;
    IDF log((N - n + 0.5) / (n + 0.5)), negative ones floored at epsilon times the mean IDF, as rank_bm25 does)."""
    n_docs, mean_length = len(texts), sum(map(len, texts)) / len(texts)
    terms = {t for text in texts for t in text}
    idf = {t: math.log((n_docs - sum(t in text for text in texts) + 0.5) / (sum(t in text for text in texts) + 0.5))
           for t in terms}
    floor = epsilon * sum(idf.values()) / len(idf)
    idf = {t: (v if v >= 0 else floor) for t, v in idf.items()}
    return [sum(idf.get(t, 0.0) * text.count(t) * (k1 + 1)
                / (text.count(t) + k1 * (1 - b + b * len(text) / mean_length)) for t in dict.fromkeys(query))
            for text in texts]


def test_lexical_negatives_are_the_questions_best_bm25_matches():
    from conftest import reading_tokenizer

    from longbird.data.windows import QAWindows
    from longbird.sources import e5_path

    # 40 questions over whole articles: most have several windows without the answer to choose from
    e5_windows = QAWindows(reading_tokenizer(e5_path()), korquad1_dev_questions(10), 128, 32, negative_fraction=1.0)
    items, questions = e5_windows.items, e5_windows.items[:, 0]
    lexical = WindowGroups(e5_windows, 2, negatives="lexical")
    random_groups = WindowGroups(e5_windows, 2, seed=1)
    assert [questions[g[0]] for g in lexical.groups] == [questions[g[0]] for g in random_groups.groups]
    checked, shared = 0, {"lexical": 0, "random": 0}

    def text(i):
        return e5_windows.documents[int(items[i, 1])].ids[items[i, 2]:items[i, 3]].tolist()

    for group, other in zip(lexical.groups, random_groups.groups):
        negative = [i for i in group if items[i, 4] == 0]
        if not negative:
            continue
        question = int(questions[group[0]])
        candidates = [i for i in range(len(items)) if questions[i] == question and items[i, 4] == 0]
        scores = bm25(e5_windows.questions[question], [text(i) for i in candidates])
        assert scores[candidates.index(negative[0])] == pytest.approx(max(scores), rel=1e-9, abs=1e-12)
        checked += 1
        query = set(e5_windows.questions[question])
        for name, chosen in (("lexical", negative[0]), ("random", next(i for i in other if items[i, 4] == 0))):
            shared[name] += len(query & set(text(chosen)))
    assert checked >= 10 and shared["lexical"] > shared["random"]
    with pytest.raises(ValueError, match="not one of random, lexical"):
        WindowGroups(e5_windows, 2, negatives="hard")


def test_reading_keeps_a_questions_windows_in_one_batch_and_links_them(monkeypatch):
    from longbird import qa
    from longbird.data.features import QAFeature

    features = [QAFeature(example, [2, 5, 6], None, [None] * 3, window_index=w)
                for example, count in (("a", 3), ("b", 2), ("c", 5), ("d", 1)) for w in range(count)]
    assert qa.question_batches(features, 5) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10]]
    assert qa.question_batches(features, 4) == [[0, 1, 2], [3, 4], [5, 6, 7, 8, 9], [10]]
    assert qa.document_ids(features[:6]) == [0, 0, 0, 1, 1, 2]
    model = linked_reader()
    set_gates(model, 0.7)
    seen = []
    forward = type(model).forward

    def recorded(self, *args, **kwargs):
        seen.append(kwargs.get("document_ids"))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", recorded)
    qa.score_windows(model, features, batch_size=5)
    assert [ids.tolist() for ids in seen] == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 0], [0]]


def short_reader_by_cli(tmp_path):
    """A tiny reader fine-tuned by `finetune-qa` (2 steps on a KorQuAD 2.1 page): (the CLI runner, the app, the
    options every call shares, the reader's directory)."""
    from test_qa_cli import PAGES, write_tiny_source
    from typer.testing import CliRunner

    from longbird.cli import app

    runner = CliRunner()
    source = write_tiny_source(tmp_path / "source")
    common = ["--preset", "kobigbird", "--max-length", "256", "--train", str(PAGES[0]), "--max-steps", "2",
              "--batch-size", "2", "--window-length", "96"]
    short = tmp_path / "short"
    result = runner.invoke(app, ["finetune-qa", "--model", str(source), *common, "--out", str(short)])
    assert result.exit_code == 0, result.output
    return runner, app, common, short


def test_finetune_qa_trains_linked_windows_end_to_end_and_refuses_what_does_not_combine(tmp_path):
    runner, app, common, short = short_reader_by_cli(tmp_path)
    linked = tmp_path / "linked"
    result = runner.invoke(app, ["convert", str(short), "--out", str(linked), "--max-length", "256",
                                 "--set", "linked_windows=true", "--set", "qa_ranking_weight=0.5"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "trained"
    result = runner.invoke(app, ["finetune-qa", "--model", str(linked), *common, "--out", str(out),
                                 "--linked-windows", "3", "--link-learning-rate", "0.01", "--linked-negatives",
                                 "lexical"])
    assert result.exit_code == 0, result.output
    record = json.loads((out / "longbird_finetune.json").read_text())
    assert record["linked_groups"] == 3 and record["settings"]["link_learning_rate"] == 0.01
    assert record["linked_negatives"] == "lexical"
    gates = LongBirdForQuestionAnswering.from_pretrained(out).longbird.encoder.links.gates
    assert gates.abs().min() > 1e-3  # two Adam steps at 0.01 moved every gate from 0
    for model, extra, message in ((short, ["--linked-windows", "3"], "has no links"),
                                  (linked, ["--linked-windows", "3", "--cut-windows", "64"], "--cut-windows"),
                                  (short, ["--link-learning-rate", "0.01"], "link gates"),
                                  (linked, ["--linked-negatives", "lexical"], "give --linked-windows N too"),
                                  (linked, ["--linked-windows", "3", "--linked-negatives", "hard"],
                                   "not one of random, lexical")):
        result = runner.invoke(app, ["finetune-qa", "--model", str(model), *common, "--out",
                                     str(tmp_path / "refused"), *extra])
        assert result.exit_code == 1 and message in result.output, result.output
        assert not (tmp_path / "refused").exists()


def test_the_server_reads_every_linked_request_as_if_alone(tiny_qa, tmp_path):  # noqa: F811 (the fixture)
    """Concurrent requests to a linked reader: each request's windows are linked among themselves only (a batch per
    request), so every answer equals the reader's answer to that request alone."""
    from concurrent.futures import ThreadPoolExecutor

    from fastapi.testclient import TestClient
    from test_qa_cli import PAGES
    from transformers import AutoTokenizer

    from longbird.data.korquad import read_korquad_v2
    from longbird.reader import Reader
    from longbird.serve import ServeSettings, create_app

    model = reconvert(LongBirdForQuestionAnswering.from_pretrained(tiny_qa), linked_windows=True)
    set_gates(model, 2.0)  # a visible exchange
    model.save_pretrained(tmp_path / "linked")
    AutoTokenizer.from_pretrained(tiny_qa).save_pretrained(tmp_path / "linked")
    reader = Reader(tmp_path / "linked")
    document, question = (lambda row: (row["context"], row["question"]))(read_korquad_v2(PAGES[0])[0][0])
    requests = [{"question": question if i % 2 else "무엇인가?", "document": document[: 3_000 + 4_000 * i],
                 "window_length": 128} for i in range(4)]
    app = create_app(reader, ServeSettings(max_batch_tokens=4_096, max_document_chars=400_000))
    client = TestClient(app)
    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda body: client.post("/answer", json=body), requests))
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    for body, response in zip(requests, responses):
        alone = reader.answer(body["question"], body["document"], window_length=128)
        assert len(alone.answers) and alone.windows > 1
        got = response.json()["answers"]
        assert [(a["start"], a["end"]) for a in got] == [(a["start"], a["end"]) for a in alone.answers]
        for served, expected in zip(got, alone.answers):  # the same function of the same rows; padding may round
            assert served["score"] == pytest.approx(expected["score"], abs=1e-4)
    unlinked = Reader(tiny_qa).answer(requests[3]["question"], requests[3]["document"], window_length=128)
    assert unlinked.answers[0]["score"] != pytest.approx(
        reader.answer(requests[3]["question"], requests[3]["document"], window_length=128).answers[0]["score"],
        abs=1e-4)  # the links do change the reading


def test_export_refuses_a_linked_reader(tmp_path):
    from longbird.export import export

    model = linked_reader()
    model.save_pretrained(tmp_path / "linked")
    for format in ("hf-bigbird", "onnx"):
        with pytest.raises(ValueError, match="linked windows"):
            export(tmp_path / "linked", tmp_path / f"out-{format}", format=format)
