"""Regional nulls (data/null_regions.py): where the nulls go, windows that fit with them, labels that follow their
tokens, lazy training items equal to the eager features, the per-region start loss against a loop of plain
cross-entropies (values and gradients), and decoding that scores a span against its own region's null."""

import pytest
import torch
from conftest import BLOCK, assert_loss_equals_loop, korquad1_dev_questions, make_source, reading_tokenizer

import longbird
from longbird.data.features import QAFeature, features_for_rows
from longbird.data.html import preprocess_html
from longbird.data.null_regions import NullRegions
from longbird.data.windows import QAWindows
from longbird.heads import LongBirdQuestionAnsweringOutput
from longbird.region_losses import IGNORE_INDEX, regional_start_loss
from longbird.qa import merge_windows, predict_rows, score_windows
from longbird.sources import e5_path
from longbird.training.finetune import qa_training_items

NULL = 2


@pytest.fixture(scope="module")
def tokenizer():
    return reading_tokenizer(e5_path())


@pytest.fixture(scope="module")
def articles():
    return korquad1_dev_questions(13)  # 31 questions over several whole articles


def test_nulls_go_before_every_region_of_the_document_past_the_first_tokens():
    regions = NullRegions(every=3, after=4, null_id=NULL)
    ids = [1, 10, 11, 3, 20, 21, 22, 23, 24, 25, 26, 3]  # [CLS] q q [SEP] d*7 [SEP]; documents from index 4
    document = [False] * 4 + [True] * 7 + [False]
    item = regions.insert(ids, document, token_type_ids=[0] * 4 + [1] * 8)
    # nulls before old tokens 4, 7 and 10 (4 + 3k), each taking a place
    assert item["input_ids"] == [1, 10, 11, 3, NULL, 20, 21, 22, NULL, 23, 24, 25, NULL, 26, 3]
    assert item["nulls"] == [4, 8, 12]
    assert item["position_ids"] == [0, 1, 2, 3, 0, 5, 6, 7, 0, 9, 10, 11, 0, 13, 14]
    assert item["region_nulls"] == [0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12]
    assert [item["input_ids"][new] for new in item["kept"]] == ids
    assert item["token_type_ids"] == [0] * 4 + [1] * 11
    assert regions.insert(ids[:4] + [3], [False] * 5)["input_ids"] == ids[:4] + [3]  # short: nothing inserted


def test_labels_follow_their_tokens_also_across_a_null_and_no_answer_stays_at_cls(tokenizer):
    """A span whose tokens straddle an inserted null keeps both ends on its own tokens (the null falls inside it, and
    its text is unchanged: a null has no offsets); a window without the answer stays labelled (0, 0)."""
    document = preprocess_html("<p>" + " ".join(f"w{i}" for i in range(40)) + "</p>")
    text = document.text
    regions = NullRegions(every=4, after=8, null_id=tokenizer.cls_token_id)
    from longbird.data.features import make_features

    plain = make_features(tokenizer, "q", "w?", document, 64)[0]
    first_document = next(i for i, o in enumerate(plain.offsets) if o is not None)
    crossing = None
    for start in range(first_document, len(plain.offsets) - 3):  # a 3-token span holding a null insertion point
        if all(plain.offsets[i] is not None for i in range(start, start + 3)) and any(
                i >= 8 and (i - 8) % 4 == 0 for i in (start + 1, start + 2)):
            crossing = start
            break
    span = (plain.offsets[crossing][0], plain.offsets[crossing + 2][1])
    without = make_features(tokenizer, "q", "w?", document, 64, answer_span=span)[0]
    labelled = make_features(tokenizer, "q", "w?", document, 64, answer_span=span, null_regions=regions)[0]
    assert without.start_position > 0
    assert labelled.input_ids[labelled.start_position:labelled.end_position + 1].count(tokenizer.cls_token_id) == 1
    assert labelled.end_position - labelled.start_position == without.end_position - without.start_position + 1

    def covered(feature):
        return text[feature.offsets[feature.start_position][0]:feature.offsets[feature.end_position][1]]

    assert covered(labelled) == covered(without)
    unanswered = make_features(tokenizer, "q", "w?", document, 64, null_regions=regions)[0]
    assert (unanswered.start_position, unanswered.end_position) == (0, 0)


@pytest.mark.parametrize("every, after", [(3, 4), (128, 512), (1, 2), (64, 512)])
def test_a_window_cut_to_its_room_fits_with_every_null(every, after):
    regions = NullRegions(every, after, NULL)
    for max_length in (after, after + 1, after + every, 700, 4096):
        room = regions.room(max_length)
        assert room + regions.count(room) <= max_length
        assert room == max_length or room + 1 + regions.count(room + 1) > max_length  # the longest that fits
        inserted = regions.insert(list(range(room)), [True] * room)["input_ids"]
        assert len(inserted) <= max_length


def test_features_with_nulls_are_the_plain_windows_with_nulls_in_and_labels_on_the_same_text(tokenizer, articles):
    regions = NullRegions(every=64, after=128, null_id=tokenizer.cls_token_id)
    plain = features_for_rows(tokenizer, articles, regions.room(512), 100)
    nulled = features_for_rows(tokenizer, articles, 512, 100, null_regions=regions)
    assert len(plain) == len(nulled) and sum(f.start_position > 0 for f in nulled) > 0
    for before, after in zip(plain, nulled):
        assert len(after.input_ids) <= 512 and len(after.input_ids) > len(before.input_ids)
        assert [t for t, o in zip(after.input_ids, after.offsets) if o is not None] == \
            [t for t, o in zip(before.input_ids, before.offsets) if o is not None]
        assert (after.offsets[after.start_position], after.offsets[after.end_position]) == \
            (before.offsets[before.start_position], before.offsets[before.end_position])
        assert (after.start_position == 0) == (before.start_position == 0)
        nulls = [i for i, (p, r) in enumerate(zip(after.position_ids, after.region_nulls)) if r == i]
        assert nulls[0] == 0 and all(after.input_ids[i] == tokenizer.cls_token_id and after.position_ids[i] == 0
                                     and after.offsets[i] is None for i in nulls)
        assert after.model_inputs()["region_nulls"] == after.region_nulls


def test_lazy_training_items_with_nulls_equal_the_eager_ones(tokenizer, articles):
    regions = NullRegions(every=64, after=128, null_id=tokenizer.cls_token_id)
    features = features_for_rows(tokenizer, articles, 512, 100, null_regions=regions)
    eager = qa_training_items(features, 0.3, 5)
    lazy = QAWindows(tokenizer, articles, 512, 100, negative_fraction=0.3, seed=5, null_regions=regions)
    assert len(lazy) == len(eager) and lazy.windows == len(features)
    assert sum(item["start_positions"] > 0 for item in eager) > 0 and "region_nulls" in eager[0]
    for index, item in enumerate(eager):
        assert lazy[index] == item, index
    assert all(bound >= len(lazy[i]["input_ids"]) for i, bound in enumerate(lazy.lengths()))
    with pytest.raises(ValueError, match=r"sliding teacher.*regional nulls"):
        QAWindows(tokenizer, articles, 512, null_regions=regions, with_question_tokens=True)


def _loop_loss(logits, region_nulls, valid, targets):
    """The per-region loss written out: one cross-entropy per region, rows averaged as the docstring says."""
    rows = []
    for row in range(logits.shape[0]):
        if targets[row] == IGNORE_INDEX:
            continue
        real = valid[row]
        nulls = sorted({int(n) for n, v in zip(region_nulls[row], real) if v})
        target = int(targets[row])
        positive, negatives = None, []
        for null in nulls:
            member = (region_nulls[row] == null) & real
            index = torch.nonzero(member).flatten()
            aim = target if target > 0 and int(region_nulls[row, target]) == null else null
            loss = torch.nn.functional.cross_entropy(logits[row, index][None], (index == aim).nonzero()[0])
            if aim == target and target > 0:
                positive = loss
            else:
                negatives.append(loss)
        negative = torch.stack(negatives).mean() if negatives else None
        rows.append(positive if negative is None else negative if positive is None else (positive + negative) / 2)
    return torch.stack(rows).mean()


def test_the_regional_start_loss_is_one_cross_entropy_per_region_with_its_gradients():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 20, generator=generator, requires_grad=True)
    region_nulls = torch.tensor([[0] * 6 + [6] * 5 + [11] * 9,  # three regions
                                 [0] * 10 + [10] * 10,  # two
                                 [0] * 20,  # one
                                 [0] * 8 + [8] * 12])
    valid = torch.ones(4, 20, dtype=torch.bool)
    valid[1, 15:] = False  # padding
    valid[3, 12:] = False
    for targets in (torch.tensor([13, 0, 4, IGNORE_INDEX]), torch.tensor([2, 12, 0, 9]),
                    torch.tensor([0, 0, 0, 0])):
        got = regional_start_loss(logits, region_nulls, valid, targets)
        # a bound on the regions from the shapes (a compiled step's) gives the same loss as the counted one
        torch.testing.assert_close(regional_start_loss(logits, region_nulls, valid, targets, max_regions=7), got,
                                   rtol=0, atol=0)
        assert_loss_equals_loop(got, _loop_loss(logits, region_nulls, valid, targets), logits, valid)


def test_one_region_is_the_plain_start_loss_and_all_ignored_rows_give_zero():
    logits = torch.randn(3, 12, requires_grad=True)
    valid = torch.ones(3, 12, dtype=torch.bool)
    targets = torch.tensor([5, 0, 9])
    plain = torch.nn.functional.cross_entropy(logits, targets)
    regional = regional_start_loss(logits, torch.zeros(3, 12, dtype=torch.long), valid, targets)
    torch.testing.assert_close(regional, plain, rtol=0, atol=1e-6)
    ignored = regional_start_loss(logits, torch.zeros(3, 12, dtype=torch.long), valid, torch.full((3,), IGNORE_INDEX))
    assert float(ignored.detach()) == 0.0 and ignored.requires_grad


class RegionLogits:
    """A stand-in reader: given start logits, and ends that put all the weight on the start (one-token spans)."""

    def __init__(self, start_logits):
        self.start_logits = torch.tensor([start_logits])
        self.config = type("Config", (), {"qa_top_k": 3, "qa_max_answer_tokens": 8, "qa_head": "conditional",
                                          "pad_token_id": 0})()
        self.device = torch.device("cpu")

    def eval(self):
        return self

    def __call__(self, input_ids, attention_mask, top_k, start_candidates=None, **kwargs):
        start = self.start_logits[:, :input_ids.shape[1]]
        top = start.masked_fill(~start_candidates, float("-inf")).topk(top_k, -1).indices
        end = torch.full((1, top_k, input_ids.shape[1]), -30.0)
        end.scatter_(2, top[..., None], 0.0)
        return LongBirdQuestionAnsweringOutput(start_logits=start, end_logits=end[:, 0], start_top_index=top,
                                               end_top_logits=end)


def test_a_span_is_scored_against_its_own_regions_null():
    """One window, two regions: "alpha" (first region, [CLS] logit 0) and "gamma" (second, its null at 9). Raw
    logits prefer gamma (5 > 3) and so does the window's [CLS]; against its own region's null gamma is 4 below
    "no answer here", and alpha wins. Log-probability normalises within the region the same way."""
    document = preprocess_html("<p>alpha beta gamma</p>")
    text = document.text
    alpha, gamma = (text.index("alpha"), text.index("alpha") + 5), (text.index("gamma"), text.index("gamma") + 5)
    feature = QAFeature("q", [1, 0, NULL, 0, 3], None, [None, alpha, None, gamma, None], position_ids=[0, 1, 0, 3, 4],
                        region_nulls=[0, 0, 2, 2, 2])
    logits = [0.0, 3.0, 9.0, 5.0, -9.0]
    windows = score_windows(RegionLogits(logits), [feature], batch_size=1)
    assert merge_windows(windows, {"q": document}, "null-relative")["q"].text == "alpha"
    assert merge_windows(windows, {"q": document}, "log-probability")["q"].text == "alpha"
    assert merge_windows(windows, {"q": document}, "logit")["q"].text == "gamma"
    best = merge_windows(windows, {"q": document}, "log-probability")["q"]
    ends = torch.log_softmax(torch.tensor([0.0, -30, -30]), -1)[0]
    region = torch.log_softmax(torch.tensor(logits[:2]), -1)[1] + ends
    assert abs(best.score - float(region)) < 1e-5 and abs(best.probability - float(region.exp())) < 1e-5
    plain = QAFeature("q", [1, 0, NULL, 0, 3], None, [None, alpha, None, gamma, None])
    assert merge_windows(score_windows(RegionLogits(logits), [plain], batch_size=1), {"q": document})["q"].text == \
        "gamma"  # the same logits with one null per window


def test_a_reader_with_regional_nulls_trains_and_reads_through_the_library(tmp_path, articles, tokenizer):
    """convert(qa_null_every=...) -> a training step on windows with nulls (loss finite, gradients reach the encoder)
    -> the real model scores windows with nulls (score_windows: per-region offsets, finite scores and probabilities);
    the setting survives save/load and reconversion; a negative value and a LittleBird model are refused."""
    from longbird.heads import LongBirdForQuestionAnswering

    base = longbird.convert(make_source("bert"), max_length=256, block_size=BLOCK, qa_null_every=16)
    model = LongBirdForQuestionAnswering(base.config)
    model.longbird.load_state_dict(base.state_dict())
    assert model.config.qa_null_every == 16
    model.save_pretrained(tmp_path / "m")
    loaded = LongBirdForQuestionAnswering.from_pretrained(tmp_path / "m")
    assert loaded.config.qa_null_every == 16
    regions = NullRegions.of(loaded.config, tokenizer)
    assert regions == NullRegions(16, loaded.config.full_attention_max_length, tokenizer.cls_token_id)
    items = QAWindows(tokenizer, articles[:4], 256, 64, negative_fraction=1.0, null_regions=regions)
    from longbird.data.batching import PaddedBatches

    batch = PaddedBatches(0)([items[i] for i in range(min(4, len(items)))])
    batch["input_ids"] = batch["input_ids"] % loaded.config.vocab_size  # the tiny model's vocabulary
    loaded.train()
    out = loaded(**batch)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert loaded.longbird.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    loaded.eval()
    features = features_for_rows(tokenizer, articles[:3], 256, 64, with_labels=False, null_regions=regions)
    assert any(len(set(f.region_nulls)) > 1 for f in features)
    for feature in features:
        feature.input_ids = [token % loaded.config.vocab_size for token in feature.input_ids]
    windows = score_windows(loaded, features, batch_size=3)
    assert all(window.region_offsets is not None for window in windows)
    scored = [(window, raw, start) for window in windows for raw, start, _ in window.spans]
    assert scored and all(torch.isfinite(torch.tensor(raw + window.offset(rule, start)))
                          for window, raw, start in scored for rule in ("null-relative", "log-probability"))
    assert all(0 < torch.exp(torch.tensor(raw + window.offset("log-probability", start))) <= 1
               for window, raw, start in scored)
    from longbird.conversion import reconvert

    plain = LongBirdForQuestionAnswering(base.config.__class__(**{**base.config.to_dict(), "qa_null_every": 0}))
    plain.load_state_dict(model.state_dict())
    switched = reconvert(plain, qa_null_every=16)  # `longbird convert QA_DIR --set qa_null_every=16`
    assert switched.config.qa_null_every == 16
    for name, tensor in plain.state_dict().items():
        assert torch.equal(switched.state_dict()[name], tensor), name
    with pytest.raises(ValueError, match="qa_null_every must be >= 0"):
        longbird.convert(make_source("bert"), max_length=256, block_size=BLOCK, qa_null_every=-1)
    with pytest.raises(ValueError, match="qa_null_every needs a position table"):
        longbird.convert(make_source("bert"), preset="littlebird", max_length=256, block_size=BLOCK, qa_null_every=16)
    with pytest.raises(ValueError, match=r"qa_null_every needs a position table.*tape_init='rope'"):
        longbird.convert(make_source("bert"), preset="tape", max_length=256, block_size=BLOCK, qa_null_every=16,
                         tape_init="rope")


def test_identity_tape_reads_regional_nulls_exactly_as_its_absolute_position_twin():
    """TAPE initialised at identity keeps the source's position table and starts every token's state at e = 1, so a
    null at position 0 deep in the window is read as the kobigbird conversion reads it: the same encoder output (and
    QA logits) with nulls in place, at a sparse length, before any training. RoPE-initialised TAPE is refused above."""
    from longbird.heads import LongBirdForQuestionAnswering

    source = make_source("bert")
    settings = dict(max_length=256, block_size=BLOCK, num_random_blocks=0, qa_null_every=16)
    plain = longbird.convert(source, preset="kobigbird", **settings).eval()
    tape = longbird.convert(source, preset="tape", attention="bigbird", **settings).eval()
    assert tape.config.qa_null_every == 16 and tape.config.position == "tape"
    regions = NullRegions(16, plain.config.full_attention_max_length, NULL)
    ids = [1] + list(range(10, 15)) + [3] + [20 + i % 70 for i in range(180)] + [3]
    item = regions.insert(ids, [False] * 7 + [True] * 180 + [False])
    assert len(item["nulls"]) > 3
    inputs = {"input_ids": torch.tensor([item["input_ids"]]), "position_ids": torch.tensor([item["position_ids"]])}
    assert inputs["input_ids"].shape[1] > plain.config.full_attention_max_length  # the sparse layers run
    with torch.no_grad():
        expected, got = plain(**inputs).last_hidden_state, tape(**inputs).last_hidden_state
    # the same arithmetic but in another order (TAPE's states ride beside V, widening every attention call): fp32
    # rounding of sums over at most 256 keys and 2 layers of O(1) values, ~1e-6 measured
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    head = LongBirdForQuestionAnswering(tape.config)
    head.longbird.load_state_dict(tape.state_dict())
    assert head.eval()(**inputs).start_logits.shape == inputs["input_ids"].shape


def test_predict_rows_inserts_the_models_nulls(monkeypatch, articles, tokenizer):
    from longbird import qa

    seen = []
    monkeypatch.setattr(qa, "predict_features", lambda model, features, *args, **kwargs: seen.extend(features) or {})
    config = type("Config", (), {"qa_null_every": 32, "full_attention_max_length": 128, "type_vocab_size": 1})()
    model = type("Model", (), {"config": config})()
    predict_rows(model, tokenizer, articles[:2], 512, 100)
    assert seen and all(f.region_nulls is not None and len(f.input_ids) <= 512 for f in seen)
    assert all(f.input_ids[i] == tokenizer.cls_token_id for f in seen for i, r in enumerate(f.region_nulls) if r == i)
    assert any(len(set(f.region_nulls)) > 1 for f in seen)  # nulls past the first region, not only [CLS]


def test_padding_insertion_shifts_the_document_but_keeps_every_null_at_position_zero():
    from longbird.training.padding_insertion import PaddingInsertion

    regions = NullRegions(every=3, after=4, null_id=NULL)
    ids = [1, 10, 11, 3, 20, 9, 22, 23, 9, 25, 26, 9, 27, 3]  # 9 ends a sentence
    item = regions.insert(ids, [False] * 4 + [True] * 9 + [False])
    batch = {"input_ids": torch.tensor([item["input_ids"]]), "attention_mask": torch.tensor([item["attention_mask"]]),
             "position_ids": torch.tensor([item["position_ids"]]), "region_nulls": torch.tensor([item["region_nulls"]])}
    shifted = PaddingInsertion([9], probability=1.0, max_gap=50, seed=0)(batch)["position_ids"][0]
    nulls = torch.tensor(item["nulls"])
    assert (shifted[nulls] == 0).all()
    others = torch.ones(len(shifted), dtype=torch.bool)
    others[nulls] = False
    assert (shifted[others] > torch.tensor(item["position_ids"])[others]).any()  # the gaps did land
