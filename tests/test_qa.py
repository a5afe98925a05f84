"""The start-then-conditional-end QA head, decoding over windows, and answers mapped back to the source."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer

import longbird
from longbird.conversion import default_source
from longbird.data.features import QAFeature, make_features
from longbird.data.html import add_tag_tokens, preprocess_html
from longbird.heads import LongBirdQuestionAnsweringOutput
from longbird.qa import decode_window, merge_windows, predict_features, score_windows
from conftest import BLOCK, make_batch, make_source

KORQUAD = Path(__file__).resolve().parents[1] / "data" / "korquad"


def qa_model(qa_head="conditional"):
    base = longbird.convert(make_source("bert"), max_length=128, block_size=BLOCK)
    model = longbird.LongBirdForQuestionAnswering(base.config.__class__(**{**base.config.to_dict(), "qa_head": qa_head}))
    model.longbird.load_state_dict(base.state_dict())
    return model


def test_conditional_end_equals_the_mlp_on_the_concatenated_states():
    torch.manual_seed(0)
    model = qa_model()
    head = model.qa_end
    hidden = torch.randn(2, 10, 32)
    starts = torch.tensor([[1, 4], [0, 9]])
    fast = head(hidden, starts)  # (2, 2, 10)
    for b in range(2):
        for k in range(2):
            pairs = torch.cat([hidden[b, starts[b, k]].expand(10, -1), hidden[b]], dim=-1)  # [h_s; h_j]
            explicit = head.out(head.LayerNorm(torch.nn.functional.gelu(head.dense(pairs)))).squeeze(-1)
            torch.testing.assert_close(fast[b, k], explicit, atol=1e-5, rtol=1e-5)


def test_teacher_forcing_conditions_the_end_on_the_gold_start_and_gradients_flow():
    model = qa_model().train()
    input_ids, attention_mask = make_batch(100)
    out = model(input_ids=input_ids, attention_mask=attention_mask, start_positions=torch.tensor([3, 10]),
                end_positions=torch.tensor([7, 12]))
    # Ends before the gold start and padding are impossible.
    lowest = torch.finfo(out.end_logits.dtype).min
    assert (out.end_logits[0, :3] == lowest).all() and (out.end_logits[0, 3:] > lowest).all()
    assert (out.end_logits[1][~attention_mask[1].bool()] == lowest).all()
    other = model(input_ids=input_ids, attention_mask=attention_mask, start_positions=torch.tensor([5, 10]),
                  end_positions=torch.tensor([7, 12]))
    assert not torch.allclose(out.end_logits[0, 5:], other.end_logits[0, 5:])  # the end depends on the start
    torch.testing.assert_close(out.end_logits[1], other.end_logits[1])
    out.loss.backward()
    for name in ("qa_start.weight", "qa_end.dense.weight", "qa_end.out.weight",
                 "longbird.encoder.layer.0.attention.self.query.weight"):
        assert model.get_parameter(name).grad.abs().sum() > 0, name


@pytest.mark.parametrize("qa_head", ["conditional", "linear"])
def test_labels_outside_the_window_are_ignored_not_clamped(qa_head):
    """An end label of 200 on 100 tokens used to be clamped onto the last token (loss ~1e37); it is ignored."""
    model = qa_model(qa_head).train()
    input_ids, attention_mask = make_batch(100)
    both = model(input_ids=input_ids, attention_mask=attention_mask, start_positions=torch.tensor([3, 5]),
                 end_positions=torch.tensor([7, 200])).loss
    first = model(input_ids=input_ids[:1], attention_mask=attention_mask[:1], start_positions=torch.tensor([3]),
                  end_positions=torch.tensor([7])).loss
    torch.testing.assert_close(both, first, atol=1e-5, rtol=1e-5)  # the out-of-range row adds nothing
    assert both.item() < 20
    none = model(input_ids=input_ids, attention_mask=attention_mask, start_positions=torch.tensor([-1, 300]),
                 end_positions=torch.tensor([7, 200])).loss
    assert none.item() == 0.0
    none.backward()  # a batch of ignored rows still backpropagates (zero gradients)


def test_decoding_outputs_end_logits_for_each_top_start():
    model = qa_model().eval()
    input_ids, attention_mask = make_batch(100)
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, top_k=3)
    assert out.start_top_index.shape == (2, 3) and out.end_top_logits.shape == (2, 3, 100)
    torch.testing.assert_close(out.start_top_index[:, 0], out.start_logits.argmax(dim=-1))
    hidden = model.longbird(input_ids, attention_mask).last_hidden_state
    expected = model.qa_end(hidden, out.start_top_index)
    allowed = out.end_top_logits > torch.finfo(out.end_top_logits.dtype).min
    torch.testing.assert_close(out.end_top_logits[allowed], expected[allowed])


def test_the_end_band_computes_the_ends_decoding_reads_and_masks_the_rest():
    """`end_width` (decoding with max_answer_tokens): within the band the same end logits as the full head, the
    lowest value outside it, and the same spans decoded, also for starts whose band runs past the window's end."""
    torch.manual_seed(0)
    model = qa_model()
    head = model.qa_end
    hidden = torch.randn(2, 40, 32)
    starts = torch.tensor([[1, 35, 20], [0, 39, 12]])  # 35 and 39: bands cut by the window's last token
    full, banded = head(hidden, starts), head(hidden, starts, width=7)
    ends = torch.arange(40)
    inside = (ends >= starts[..., None]) & (ends - starts[..., None] < 7)
    # the same sums, but out's product over the band's rows may be blocked differently: fp32 rounding of the
    # 32-term dot products (h eps times the sum of the terms' magnitudes), far below it in practice
    mixed = head.LayerNorm(head.activation(hidden[:, None] @ head.dense.weight[:, 32:].T
                                           + (hidden.gather(1, starts[..., None].expand(-1, -1, 32))
                                              @ head.dense.weight[:, :32].T + head.dense.bias)[:, :, None]))
    bound = 32 * torch.finfo(torch.float32).eps * (mixed.abs() @ head.out.weight.abs().T).squeeze(-1)
    assert ((banded - full).abs()[inside] <= bound[inside] + 1e-7).all()
    assert (banded[~inside & (ends >= starts[..., None])] == torch.finfo(torch.float32).min).all()
    with torch.no_grad():
        input_ids, attention_mask = make_batch(100)
        whole = model.eval()(input_ids=input_ids, attention_mask=attention_mask, top_k=4)
        band = model(input_ids=input_ids, attention_mask=attention_mask, top_k=4, end_width=5)
    torch.testing.assert_close(band.start_logits, whole.start_logits, rtol=0, atol=0)
    offsets = [(0, 1)] * 100
    feature = QAFeature(example_id="q", input_ids=input_ids[0].tolist(), token_type_ids=None,
                        offsets=[None] + offsets[1:])
    for width in (1, 5):
        expected = decode_window(feature, whole.start_top_index[0], whole.end_top_logits[0], whole.start_logits[0],
                                 top_k=4, max_answer_tokens=width)
        got = decode_window(feature, band.start_top_index[0], band.end_top_logits[0], band.start_logits[0],
                            top_k=4, max_answer_tokens=width)
        assert [span[1:] for span in got] == [span[1:] for span in expected]
        torch.testing.assert_close([span[0] for span in got], [span[0] for span in expected], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qa_head", ["conditional", "linear"])
def test_both_heads_save_and_load(tmp_path, qa_head):
    model = qa_model(qa_head).eval()
    model.save_pretrained(tmp_path)
    loaded = longbird.LongBirdForQuestionAnswering.from_pretrained(tmp_path).eval()
    input_ids, attention_mask = make_batch(70)
    with torch.no_grad():
        a, b = model(input_ids=input_ids, attention_mask=attention_mask), loaded(input_ids=input_ids,
                                                                                   attention_mask=attention_mask)
    torch.testing.assert_close(a.start_logits, b.start_logits)
    torch.testing.assert_close(a.end_top_logits, b.end_top_logits)


class StandInReader:
    """What decoding reads of a QA model besides its logits: a conditional head's config, a device, eval()."""

    def __init__(self, top_k: int):
        self.config = SimpleNamespace(qa_top_k=top_k, qa_max_answer_tokens=64, pad_token_id=0, qa_head="conditional",
                                      type_vocab_size=2)
        self.device = torch.device("cpu")
        self.calls = 0

    def eval(self):
        return self


class GoldLogits(StandInReader):
    """A stand-in model whose logits point at a chosen (window, start, end): decoding must recover that span."""

    def __init__(self, gold: dict[int, tuple[int, int]], top_k=3):
        super().__init__(top_k)
        self.gold = gold

    def __call__(self, input_ids, attention_mask, top_k, token_type_ids=None, start_candidates=None, end_width=None,
                 return_dict=True):
        batch, length = input_ids.shape
        start = torch.zeros(batch, length)
        end = torch.zeros(batch, top_k, length)
        top = torch.arange(top_k).repeat(batch, 1) + 1
        for row in range(batch):
            window = self.calls + row
            if window in self.gold:
                s, e = self.gold[window]
                start[row, s] = 10.0
                top[row, 0] = s
                end[row, 0, e] = 10.0
        self.calls += batch
        return LongBirdQuestionAnsweringOutput(start_logits=start, end_logits=end[:, 0], start_top_index=top,
                                               end_top_logits=end)


def test_gold_logits_decode_to_the_gold_answer_text_of_a_real_page():
    tokenizer = AutoTokenizer.from_pretrained(default_source(), local_files_only=True)
    tokenizer.model_max_length = 1 << 20
    add_tag_tokens(tokenizer)
    record = json.loads((KORQUAD / "korquad2.1_train_00.json").read_text(encoding="utf-8"))["data"][0]
    qa = record["qas"][0]
    document = preprocess_html(record["context"])
    span = (qa["answer"]["answer_start"], qa["answer"]["answer_start"] + len(qa["answer"]["text"]))
    features = make_features(tokenizer, qa["id"], qa["question"], document, 256, 64, span)
    gold = {i: (f.start_position, f.end_position) for i, f in enumerate(features) if f.start_position > 0}
    assert gold
    answers = predict_features(GoldLogits(gold), features, {qa["id"]: document}, batch_size=3)
    answer = answers[qa["id"]]
    assert answer.text == qa["answer"]["text"] == record["context"][answer.start:answer.end]
    assert answer.window_index in gold


def test_decode_window_respects_order_length_and_context():
    feature = SimpleNamespace(input_ids=[0] * 6, offsets=[None, (0, 1), (1, 2), (2, 3), (3, 4), None])
    start_logits = torch.tensor([9.0, 1.0, 2.0, 0.0, 0.0, 9.0])
    # Row k holds the end logits given the k-th best start (here starts 2, then 1).
    end_top = torch.tensor([[0.0, 5.0, 0.0, 1.0, 3.0, 9.0], [0.0, 0.0, 0.0, 3.5, 7.0, 0.0]])
    candidates = decode_window(feature, torch.tensor([2, 1]), end_top, start_logits, top_k=6, max_answer_tokens=3,
                               normalise_ends=False)  # raw end logits: the linear head's scores
    spans = [(s, e) for _, s, e in candidates]
    assert spans[0] == (2, 4) and candidates[0][0] == 2.0 + 3.0
    assert spans[1] == (1, 3)  # 1 + 3.5
    assert (2, 1) not in spans  # the end precedes the start (its logit 5 is ignored)
    assert (2, 5) not in spans  # [SEP] is outside the document
    assert (1, 4) not in spans  # four tokens > max_answer_tokens, despite the best end logit


def test_conditional_decoding_ignores_a_per_start_shift_of_the_end_logits():
    """The conditional-end loss cannot see a constant added to one start's end logits, so decoding must not either:
    scores are start logit + log-softmax over the ends that start allows (masked before the top-k)."""
    feature = SimpleNamespace(input_ids=[0] * 8, offsets=[None] + [(i, i + 1) for i in range(6)] + [None])
    start_logits = torch.tensor([0.0, 1.0, 1.5, 0.5, 0.0, 0.0, 0.0, 0.0])
    starts = torch.tensor([2, 1, 3])
    end_top = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    base = decode_window(feature, starts, end_top, start_logits, top_k=4, max_answer_tokens=3)
    shifted = decode_window(feature, starts, end_top + torch.tensor([[40.0], [-25.0], [7.0]]), start_logits,
                            top_k=4, max_answer_tokens=3)
    assert [(s, e) for _, s, e in base] == [(s, e) for _, s, e in shifted]
    torch.testing.assert_close(torch.tensor([c[0] for c in base]), torch.tensor([c[0] for c in shifted]))
    # Each start's allowed ends form a distribution: their probabilities sum to 1 (all allowed ends kept: k >= 3).
    for start in (1, 2, 3):
        mass = sum(torch.exp(torch.tensor(score - float(start_logits[start]))) for score, s, _ in base if s == start)
        assert abs(float(mass) - 1.0) < 1e-5
    # Raw end logits (the linear head) do depend on the shift: the test can fail.
    raw = decode_window(feature, starts, end_top + torch.tensor([[40.0], [-25.0], [7.0]]), start_logits,
                        top_k=4, max_answer_tokens=3, normalise_ends=False)
    assert raw[0][1] == 2 and [(s, e) for _, s, e in raw] != [(s, e) for _, s, e in base]


def test_disallowed_ends_are_masked_before_the_top_k():
    """A start whose best raw end logits all lie before it or past the length limit still gets its allowed ends."""
    feature = SimpleNamespace(input_ids=[0] * 10, offsets=[None] + [(i, i + 1) for i in range(8)] + [None])
    start_logits = torch.zeros(10)
    end_top = torch.tensor([[9.0, 9.0, 9.0, 9.0, 0.0, 0.5, 9.0, 9.0, 9.0, 9.0]])  # start 4: ends 4, 5 allowed
    spans = [(s, e) for _, s, e in decode_window(feature, torch.tensor([4]), end_top, start_logits, top_k=2,
                                                  max_answer_tokens=2)]
    assert spans == [(4, 5), (4, 4)]


def test_answers_never_start_or_end_with_the_space_a_metaspace_token_carries():
    document = preprocess_html("<p>아버지는 신중현 이다</p>")
    start = document.text.index(" 신중현")  # "▁신중현": the offsets of an XLM-R piece include the space before it
    feature = QAFeature("q", [0] * 3, None, [None, (start, start + 4), None])
    answers = predict_features(GoldLogits({0: (1, 1)}, top_k=1), [feature], {"q": document}, batch_size=1)
    assert answers["q"].text == "신중현"


def test_a_tag_only_best_span_gives_way_to_the_next_candidate():
    """If the best span holds only tag tokens ("[td]"), the next candidate of the window is taken."""
    document = preprocess_html("<table><tr><td>Seoul</td></tr></table>")
    assert document.text == "[table] [tr] [td] Seoul"
    td = document.text.index("[td]")
    seoul = document.text.index("Seoul")
    feature = QAFeature("q", [0] * 4, None, [None, (td, td + 4), (seoul, seoul + 5), None])
    gold = {0: (1, 1)}
    model = GoldLogits(gold, top_k=2)
    original = model.__call__

    def with_runner_up(**batch):
        out = original(**batch)
        out.start_top_index[0, 1] = 1
        out.end_top_logits[0, 1, 2] = 5.0  # [td] Seoul, second best
        return out

    answers = predict_features(_Callable(with_runner_up, model.config), [feature], {"q": document}, batch_size=1)
    assert answers["q"].text == "Seoul"


class _Callable:
    device = torch.device("cpu")

    def __init__(self, function, config):
        self.function, self.config = function, config

    def eval(self):
        return self

    def __call__(self, **batch):
        return self.function(**batch)


def test_start_candidates_restrict_the_top_starts_only():
    model = qa_model().eval()
    input_ids, attention_mask = make_batch(60)
    allowed = torch.zeros(2, 60, dtype=torch.bool)
    allowed[:, 20:30] = True
    with torch.no_grad():
        free = model(input_ids=input_ids, attention_mask=attention_mask, top_k=4)
        limited = model(input_ids=input_ids, attention_mask=attention_mask, top_k=4, start_candidates=allowed)
    assert ((limited.start_top_index >= 20) & (limited.start_top_index < 30)).all()
    torch.testing.assert_close(free.start_logits, limited.start_logits)


class FixedLogits(StandInReader):
    """A stand-in model that returns given start logits (one row per window) and, for each start, end logits that
    put all the weight on the start token itself (P(end = start | start) = 1 up to e^-30): one-token spans."""

    def __init__(self, start_logits: list[list[float]]):
        super().__init__(top_k=2)
        self.start_logits = torch.tensor(start_logits)

    def __call__(self, input_ids, attention_mask, top_k, token_type_ids=None, start_candidates=None, end_width=None,
                 return_dict=True):
        batch, length = input_ids.shape
        start = self.start_logits[self.calls:self.calls + batch, :length]
        self.calls += batch
        top = start.masked_fill(~start_candidates, float("-inf")).topk(top_k, -1).indices
        end = torch.full((batch, top_k, length), -30.0)
        end.scatter_(2, top[..., None], 0.0)
        return LongBirdQuestionAnsweringOutput(start_logits=start, end_logits=end[:, 0], start_top_index=top,
                                               end_top_logits=end)


def _two_windows():
    """One question over "alpha beta gamma": window 0 reads alpha, window 1 reads gamma (token 0 is [CLS])."""
    document = preprocess_html("<p>alpha beta gamma</p>")
    text = document.text
    first = QAFeature("q", [0] * 3, None, [None, (text.index("alpha"), text.index("alpha") + 5), None], window_index=0)
    second = QAFeature("q", [0] * 3, None, [None, (text.index("gamma"), text.index("gamma") + 5), None],
                       window_index=1)
    return [first, second], {"q": document}


def _answer(start_logits, scoring):
    features, documents = _two_windows()
    return predict_features(FixedLogits(start_logits), features, documents, batch_size=1, scoring=scoring)["q"]


def test_window_scores_are_comparable_under_a_per_window_shift_of_the_start_logits():
    """The start loss is a softmax within one window, blind to a constant added to all of that window's start
    logits. The log-probability and null-relative rules give the same answer and score under any such shift; the
    raw-logit rule does not (the test can fail: the shift flips its winner)."""
    windows = [[0.0, 3.0, -9.0], [0.0, 2.0, -9.0]]  # window 0 is surer of its span: alpha
    for scoring in ("log-probability", "null-relative"):
        plain = _answer(windows, scoring)
        shifted = _answer([windows[0], [v + 25.0 for v in windows[1]]], scoring)
        assert plain.text == shifted.text == "alpha"
        assert abs(plain.score - shifted.score) <= 4 * torch.finfo(torch.float32).eps * 25.0
    assert _answer(windows, "logit").text == "alpha"
    assert _answer([windows[0], [v + 25.0 for v in windows[1]]], "logit").text == "gamma"


def test_a_window_that_points_at_cls_loses_to_one_that_holds_the_answer():
    """Training points a window without the answer at [CLS]: a span with a higher raw logit in such a window
    loses under both comparable rules, and wins under the raw-logit rule."""
    windows = [[1.0, 4.0, -9.0], [12.0, 6.0, -9.0]]  # window 1: "no answer here" (CLS 12), its span logit 6 > 4
    assert _answer(windows, "logit").text == "gamma"
    assert _answer(windows, "log-probability").text == "alpha"
    assert _answer(windows, "null-relative").text == "alpha"


def test_log_probability_score_is_the_span_probability_in_its_window():
    windows = [[0.5, 3.0, -2.0], [0.0, 1.0, -9.0]]
    answer = _answer(windows, "log-probability")
    expected = torch.log_softmax(torch.tensor(windows[0]), -1)[1] + torch.log_softmax(torch.tensor([-30.0, 0.0, -30.0]), -1)[1]
    assert answer.text == "alpha"
    # terms of size ~3 summed in fp32: a few ulps (~1e-6); 1e-5 leaves room for the logsumexp rounding
    assert abs(answer.score - float(expected)) < 1e-5 and abs(answer.probability - float(expected.exp())) < 1e-5


def test_start_candidates_per_window_keep_only_their_starts():
    """E7's diagnosis reads near the gold answer: window 0 (alpha) would win, but with its starts disallowed the answer
    is window 1's gamma, and a window with no allowed start contributes nothing (not its disallowed best)."""
    features, documents = _two_windows()
    windows = [[0.0, 3.0, -9.0], [0.0, 2.0, -9.0]]
    free = score_windows(FixedLogits(windows), features, batch_size=2)
    assert merge_windows(free, documents)["q"].text == "alpha"
    near = score_windows(FixedLogits(windows), features, batch_size=2,
                         start_candidates=[torch.tensor([False, False, False]), torch.tensor([False, True, False])])
    assert near[0].spans == [] and [span[1] for span in near[1].spans] == [1]
    assert merge_windows(near, documents)["q"].text == "gamma"


def test_an_unknown_scoring_rule_is_named_before_the_model_runs():
    features, documents = _two_windows()
    model = FixedLogits([[0.0, 1.0, 0.0]] * 2)
    with pytest.raises(ValueError, match="unknown scoring rule 'best'.*log-probability"):
        predict_features(model, features, documents, scoring="best")
    assert model.calls == 0
