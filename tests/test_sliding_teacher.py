"""Distillation from the sliding reader (training/sliding_teacher.py): the merged targets are the teacher's own
distributions where it reads a window whole, each document token takes its score from its max-context teacher window,
the end target is P(end | gold start) of the right window, a student equal to its teacher diverges by rounding only,
and the trainer's loss mixes gold and soft targets with gradients reaching the student."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import BLOCK, VOCAB, kl_rounding_bound, make_source

import longbird
from longbird.data.windows import PairTemplate, window_ranges
from longbird.training.sliding_teacher import SlidingTeacher, divergence, max_context_windows

TEMPLATE = PairTemplate(prefix=(2,), middle=(3,), suffix=(3,), types=None)  # [CLS] q [SEP] d [SEP], ids 2 and 3


def qa_model(qa_head: str, seed: int = 0):
    base = longbird.convert(make_source("bert", seed=seed), max_length=256, block_size=BLOCK)
    torch.manual_seed(seed)
    model = longbird.LongBirdForQuestionAnswering(base.config.__class__(**{**base.config.to_dict(), "qa_head": qa_head}))
    model.longbird.load_state_dict(base.state_dict())
    return model.eval()


def long_window(question: int, document: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    q = torch.randint(5, VOCAB, (question,), generator=generator).tolist()
    d = torch.randint(5, VOCAB, (document,), generator=generator).tolist()
    return [2, *q, 3, *d, 3]


def batch_of(ids: list[int], question: int, gold: int):
    return (torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long), torch.tensor([question]),
            torch.tensor([gold]))


def test_max_context_picks_the_window_where_a_token_is_most_central():
    for length, room, stride in ((100, 30, 10), (57, 20, 5), (40, 40, 8), (200, 64, 32)):
        ranges = window_ranges(length, room, stride)
        chosen = max_context_windows(length, ranges)
        for token in range(length):
            scores = [min(token - b, s - 1 - token) + 0.01 * (s - b) if b <= token < s else -np.inf
                      for b, s in ranges]
            assert chosen[token] == int(np.argmax(scores))  # brute force, first on ties
    with pytest.raises(ValueError, match="do not cover"):
        max_context_windows(10, [(0, 4), (6, 10)])


@pytest.mark.parametrize("qa_head", ["conditional", "linear"])
def test_a_window_the_teacher_reads_whole_gets_the_teachers_own_distributions(qa_head):
    model = qa_model(qa_head)
    question, document, gold = 6, 40, 20
    ids = long_window(question, document)
    teacher = SlidingTeacher(model, TEMPLATE, window_length=64, doc_stride=16)
    targets = teacher.targets(*batch_of(ids, question, gold))
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), start_positions=torch.tensor([gold]),
                    end_positions=torch.tensor([gold]))
    doc = slice(question + 2, question + 2 + document)
    support = torch.zeros(len(ids), dtype=torch.bool)
    support[0] = True
    support[doc] = True
    expected = torch.log_softmax(out.start_logits[0].masked_fill(~support, float("-inf")), -1)
    torch.testing.assert_close(targets.start[0], expected, atol=1e-5, rtol=0)
    assert torch.isinf(targets.start[0, ~support]).all()
    if qa_head == "conditional":  # P(end | gold start) over the document tokens from the start on
        ends = torch.zeros(len(ids), dtype=torch.bool)
        ends[gold:doc.stop] = True
        expected_end = torch.log_softmax(out.end_logits[0].masked_fill(~ends, float("-inf")), -1)
    else:
        expected_end = torch.log_softmax(out.end_logits[0].masked_fill(~support, float("-inf")), -1)
    torch.testing.assert_close(targets.end[0], expected_end, atol=1e-5, rtol=0)
    assert bool(targets.has_end[0])
    # the same model as student: no divergence beyond fp32 rounding of the two cancelling sums
    bound = kl_rounding_bound(len(ids))
    assert abs(float(divergence(targets.start, out.start_logits, torch.tensor([True])))) < bound
    assert abs(float(divergence(targets.end, out.end_logits, torch.tensor([True])))) < bound


def test_each_token_takes_its_null_relative_score_from_its_max_context_window():
    model = qa_model("conditional")
    question, document, gold = 5, 150, 90
    ids = long_window(question, document, seed=1)
    teacher = SlidingTeacher(model, TEMPLATE, window_length=48, doc_stride=12, temperature=2.0)
    targets = teacher.targets(*batch_of(ids, question, gold))
    room = 48 - question - 3
    ranges = window_ranges(document, room, 12)
    assert len(ranges) > 3
    before = question + 2
    d = ids[before:before + document]
    scores, window_outputs = [], []
    with torch.no_grad():
        for begin, stop in ranges:
            window = [2, *ids[1:1 + question], 3, *d[begin:stop], 3]
            inside = begin <= gold - before < stop
            start = before + gold - before - begin if inside else 0
            window_outputs.append(model(input_ids=torch.tensor([window]), start_positions=torch.tensor([start]),
                                        end_positions=torch.tensor([start])))
    owner = max_context_windows(document, ranges)
    for token in range(document):
        out = window_outputs[owner[token]]
        logits = out.start_logits[0]
        scores.append(float(logits[before + token - ranges[owner[token]][0]] - logits[0]))
    expected = torch.log_softmax(torch.tensor([0.0, *scores]) / 2.0, -1)
    got = torch.cat([targets.start[0, :1], targets.start[0, before:before + document]])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    # the end: P(end | gold start) of the gold start's own max-context window, up to that window's end
    index = owner[gold - before]
    begin, stop = ranges[index]
    ends = window_outputs[index].end_logits[0, gold - begin:before + stop - begin] / 2.0
    torch.testing.assert_close(targets.end[0, gold:before + stop], torch.log_softmax(ends, -1), atol=1e-5, rtol=0)
    assert torch.isinf(targets.end[0, before + stop:]).all() and torch.isinf(targets.end[0, :gold]).all()


def test_a_row_without_the_answer_has_a_start_target_but_no_conditional_end_target():
    model = qa_model("conditional")
    ids = long_window(4, 60)
    targets = SlidingTeacher(model, TEMPLATE, window_length=32, doc_stride=8).targets(*batch_of(ids, 4, 0))
    assert not bool(targets.has_end[0]) and torch.isfinite(targets.start[0, 0])
    assert abs(float(targets.start[0].exp().sum()) - 1) < 1e-5


def test_the_divergence_reaches_the_student_and_ignores_rows_without_targets():
    teacher_model, student = qa_model("conditional", seed=0), qa_model("conditional", seed=1).train()
    ids = long_window(6, 100, seed=2)
    teacher = SlidingTeacher(teacher_model, TEMPLATE, window_length=40, doc_stride=10)
    targets = teacher.targets(*batch_of(ids, 6, 50))
    out = student(input_ids=torch.tensor([ids]), start_positions=torch.tensor([50]), end_positions=torch.tensor([55]))
    soft = divergence(targets.start, out.start_logits, torch.tensor([True]))
    assert float(soft.detach()) > 1e-4
    soft.backward()
    assert student.qa_start.weight.grad.abs().sum() > 0
    none = divergence(targets.end, out.end_logits, torch.tensor([False]))
    assert float(none.detach()) == 0.0 and none.requires_grad


def test_bad_settings_are_named():
    model = qa_model("conditional")
    with pytest.raises(ValueError, match="temperature"):
        SlidingTeacher(model, TEMPLATE, temperature=0)
    with pytest.raises(ValueError, match="at most 256"):
        SlidingTeacher(model, TEMPLATE, window_length=1024)
    teacher = SlidingTeacher(model, TEMPLATE, window_length=32, doc_stride=30)
    with pytest.raises(ValueError, match="doc_stride 30"):
        teacher.targets(*batch_of(long_window(6, 60), 6, 0))


def test_finetune_qa_distils_from_a_sliding_teacher_end_to_end(tmp_path, monkeypatch):
    """finetune-qa --teacher: a short reader trained at 64-token windows teaches a 256-token reader; the teacher reads
    every training window in its own 64-token windows, its record lands in longbird_finetune.json, and a teacher
    with another vocabulary or Padding Insertion beside it is refused with the fix."""
    import json

    from test_qa_cli import PAGES, write_tiny_source
    from transformers import AutoTokenizer, BertConfig, BertModel
    from typer.testing import CliRunner

    from longbird.cli import app
    from longbird.training import sliding_teacher as module

    runner = CliRunner()
    source = write_tiny_source(tmp_path / "source")
    short = tmp_path / "short"
    common = ["--model", str(source), "--preset", "kobigbird", "--max-length", "256", "--train", str(PAGES[0]),
              "--max-steps", "2", "--batch-size", "2", "--negative-fraction", "0.3"]
    result = runner.invoke(app, ["finetune-qa", *common, "--window-length", "64", "--out", str(short)])
    assert result.exit_code == 0, result.output
    calls = []
    targets = module.SlidingTeacher.targets

    def counted(self, input_ids, *args):
        calls.append((self.window_length, input_ids.shape))
        return targets(self, input_ids, *args)

    monkeypatch.setattr(module.SlidingTeacher, "targets", counted)
    long = tmp_path / "long"
    result = runner.invoke(app, ["finetune-qa", *common, "--window-length", "256", "--out", str(long), "--teacher",
                                 str(short), "--teacher-weight", "0.7", "--teacher-temperature", "2"])
    assert result.exit_code == 0, result.output
    assert len(calls) == 2 and all(window == 64 and shape[1] > 64 for window, shape in calls)
    record = json.loads((long / "longbird_finetune.json").read_text())["teacher"]
    assert record == {"model": str(short), "window_length": 64, "doc_stride": record["doc_stride"], "weight": 0.7,
                      "temperature": 2.0} and 0 <= record["doc_stride"] < 64
    result = runner.invoke(app, ["finetune-qa", *common, "--out", str(tmp_path / "pi"), "--teacher", str(short),
                                 "--padding-insertion"])
    assert result.exit_code == 1 and "Padding Insertion" in result.output
    other = write_tiny_source(tmp_path / "other")
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["[a-word-the-teacher-never-saw]"])
    tokenizer.save_pretrained(other)
    config = json.loads((other / "config.json").read_text())
    BertModel(BertConfig(**{**config, "vocab_size": len(tokenizer)})).save_pretrained(other)
    result = runner.invoke(app, ["finetune-qa", *common, "--model", str(other), "--out", str(tmp_path / "v"),
                                 "--teacher", str(short)])
    assert result.exit_code == 1 and "another vocabulary" in result.output


def test_a_cpu_budget_stops_training_and_a_constant_schedule_keeps_the_rate(tmp_path, caplog):
    """finetune-qa --cpu-minutes stops at the first step past the budget (the steps and CPU seconds recorded);
    --lr-scheduler constant keeps the learning rate after warmup; a bad schedule is named."""
    import json

    from test_qa_cli import PAGES, write_tiny_source
    from typer.testing import CliRunner

    from longbird.cli import app

    runner = CliRunner()
    source = write_tiny_source(tmp_path / "source")
    common = ["finetune-qa", "--model", str(source), "--preset", "kobigbird", "--max-length", "256", "--train",
              str(PAGES[0]), "--max-steps", "40", "--batch-size", "2", "--logging-steps", "1",
              "--learning-rate", "3e-4"]
    out = tmp_path / "budget"
    with caplog.at_level("WARNING", logger="longbird.training.finetune"):
        result = runner.invoke(app, [*common, "--out", str(out), "--cpu-minutes", "0.001", "--lr-scheduler",
                                     "constant"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "longbird_finetune.json").read_text())
    budget = summary["metrics"]["cpu_budget"]
    assert budget["minutes"] == 0.001 and budget["steps"] >= 1 and budget["cpu_seconds"] >= 0.06
    steps = [entry for entry in summary["log_history"] if "learning_rate" in entry]
    assert max(entry["step"] for entry in steps) == budget["steps"] < 40  # stopped by the budget, not max-steps
    # said, once (the progress bar stopped short with an estimate for the steps that never ran)
    assert [r.getMessage() for r in caplog.records if "budget" in r.getMessage()] == [
        f"the budget (--cpu-minutes 0.001) is spent: training stops at step {budget['steps']} of 40"]
    out = tmp_path / "constant"  # 10 steps: 1 of warmup (10 %), then the rate stays
    result = runner.invoke(app, [*common[:-8], "--max-steps", "10", "--batch-size", "2", "--logging-steps", "1",
                                 "--learning-rate", "3e-4", "--out", str(out), "--lr-scheduler", "constant"])
    assert result.exit_code == 0, result.output
    rates = [entry["learning_rate"] for entry in json.loads((out / "longbird_finetune.json").read_text())[
        "log_history"] if "learning_rate" in entry]
    assert len(rates) == 10 and all(rate == pytest.approx(3e-4, rel=1e-6) for rate in rates[1:])
    out = tmp_path / "no-warmup"  # --warmup-ratio 0: the full rate from the first step (what a budgeted run needs)
    result = runner.invoke(app, [*common[:-8], "--max-steps", "3", "--batch-size", "2", "--logging-steps", "1",
                                 "--learning-rate", "3e-4", "--out", str(out), "--lr-scheduler", "constant",
                                 "--warmup-ratio", "0"])
    assert result.exit_code == 0, result.output
    rates = [entry["learning_rate"] for entry in json.loads((out / "longbird_finetune.json").read_text())[
        "log_history"] if "learning_rate" in entry]
    assert len(rates) == 3 and all(rate == pytest.approx(3e-4, rel=1e-6) for rate in rates)
    result = runner.invoke(app, [*common, "--out", str(tmp_path / "bad"), "--lr-scheduler", "cosine"])
    assert result.exit_code == 1 and "'linear' or 'constant'" in result.output


def test_a_budgeted_run_is_not_warned_about_its_step_bound():
    """--max-steps 100,000 over 4,000 windows would read each 100 times: a warning, unless --cpu-minutes stops the run
    (then the steps are only a bound)."""
    from longbird.training.finetune import FinetuneSettings, memorisation_warning

    bounded = FinetuneSettings(max_steps=100_000, batch_size=4)
    assert "by heart" in memorisation_warning(4_000, bounded)
    assert memorisation_warning(4_000, FinetuneSettings(max_steps=100_000, batch_size=4, cpu_minutes=30)) is None
    assert memorisation_warning(4_000, FinetuneSettings(max_steps=1_000, batch_size=4)) is None  # one pass
