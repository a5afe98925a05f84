"""Distillation from the short model (issue 12, step 2 of LittleBird §3.4): the attention KL and soft-target losses,
training lowers them, and `longbird distill` runs and resumes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import longbird
from longbird.cli import app
from longbird.training.distill import distillation_loss
from conftest import BLOCK, kl_rounding_bound, make_batch, make_source
from test_qa_cli import tiny_source  # noqa: F401  (fixture)

runner = CliRunner()


def _teacher():
    teacher = make_source("bert")
    teacher.set_attn_implementation("eager")
    return teacher


@pytest.mark.parametrize("preset", ["full", "kobigbird"])
def test_loss_is_zero_when_the_student_is_the_teacher(preset):
    """At <= L tokens a full or kobigbird conversion computes exactly the source: nothing to distil."""
    teacher = _teacher()
    student = longbird.convert(teacher, preset=preset, max_length=256, block_size=BLOCK)
    input_ids, attention_mask = make_batch(60, batch=2)
    loss, parts = distillation_loss(teacher, student, {"input_ids": input_ids, "attention_mask": attention_mask})
    assert abs(loss.item()) <= kl_rounding_bound(60) and float(parts["pack_mass"]) == 0.0


def test_littlebird_loss_is_positive_and_one_step_lowers_it():
    teacher = _teacher()
    student = longbird.convert(teacher, preset="littlebird", max_length=256, block_size=BLOCK, pack_size=4).train()
    for module in student.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    batch = dict(zip(("input_ids", "attention_mask"), make_batch(64, batch=2)))
    before, parts = distillation_loss(teacher, student, batch)
    assert float(before) > 0.01 and 0.0 < float(parts["pack_mass"]) < 1.0
    optimizer = torch.optim.SGD(student.parameters(), lr=0.05)
    before.backward()
    assert student.encoder.layer[0].bialibi.beta.grad.abs().sum() > 0  # the slopes learn from the attention maps
    optimizer.step()
    after, _ = distillation_loss(teacher, student, batch)
    assert float(after) < float(before)


def _antiberty():
    """AntiBERTy (package antiberty==0.1.3): an 8-layer BERT with a trained MLM head over 25 amino-acid tokens."""
    antiberty = pytest.importorskip("antiberty")
    from transformers import BertConfig, BertForMaskedLM

    directory = Path(antiberty.__file__).parent / "trained_models" / "AntiBERTy_md_smooth"
    config = BertConfig.from_pretrained(directory)
    model = BertForMaskedLM(config)
    state = torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    missing, _ = model.load_state_dict({k: v for k, v in state.items() if not k.startswith(("cls.species",
                                        "cls.chain", "cls.graft"))}, strict=False)
    assert not [name for name in missing if "position_ids" not in name]
    model.set_attn_implementation("eager")
    return model.eval()


def test_soft_targets_on_a_real_mlm_head():
    teacher = _antiberty()
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, 25, (2, 48), generator=generator)
    input_ids[:, 0], input_ids[:, -1] = 2, 3
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    same = longbird.convert(teacher, preset="full", max_length=512)
    loss, parts = distillation_loss(teacher, same, batch)
    assert abs(float(parts["soft_target_kl"])) < 1e-5 and abs(float(loss)) < 1e-5
    student = longbird.convert(teacher, preset="littlebird", max_length=512, block_size=16, pack_size=8)
    loss, parts = distillation_loss(teacher, student, batch, alpha=1.0, beta=0.0)
    assert float(parts["soft_target_kl"]) > 1e-3 and float(loss) == pytest.approx(float(parts["soft_target_kl"]))


def test_distill_command_runs_checkpoints_and_resumes_to_the_same_losses(tiny_source, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(f"the law number {i} says that the state shall protect rights." for i in range(80)))
    common = ["distill", "--teacher", str(tiny_source), "--preset", "littlebird", "--max-length", "256", "--corpus",
              str(corpus), "--length", "64", "--batch-size", "2", "--save-steps", "2", "--learning-rate", "1e-3", "--logging-steps", "1"]

    def losses(directory):
        summary = json.loads((directory / "model" / "longbird_distill.json").read_text())
        return [entry["loss"] for entry in summary["log_history"] if "loss" in entry]

    straight = tmp_path / "straight"
    result = runner.invoke(app, common + ["--output-dir", str(straight), "--max-steps", "4"])
    assert result.exit_code == 0, result.output
    assert "{'loss'" not in result.output  # Trainer's raw metrics dicts are not printed (longbird --verbose does)
    model = longbird.LongBirdModel.from_pretrained(straight / "model")
    assert model.config.attention == "littlebird" and (straight / "checkpoints" / "checkpoint-4").is_dir()
    # A run killed after step 2 (kill -9: only its checkpoint-2 survives) resumes to the uninterrupted losses.
    import shutil

    resumed = tmp_path / "resumed"
    shutil.copytree(straight / "checkpoints" / "checkpoint-2", resumed / "checkpoints" / "checkpoint-2")
    result = runner.invoke(app, common + ["--output-dir", str(resumed), "--max-steps", "4", "--resume"])
    assert result.exit_code == 0, result.output
    assert len(losses(straight)) == 4 and losses(straight)[0] != losses(straight)[-1]
    assert losses(resumed) == pytest.approx(losses(straight), rel=1e-5)
    # the summary records the run's own checkpoint settings (it recorded save_steps 0 and resume false) and how many
    # documents were held out for pretrain's RSS score
    summary = json.loads((resumed / "model" / "longbird_distill.json").read_text())
    assert (summary["settings"]["save_steps"], summary["settings"]["resume"]) == (2, True)
    assert summary["held_out_documents"] == 0 and len(summary["training_document_sha256"]) == 1  # one document: kept
    # a resume with another --length or Padding Insertion is refused (it went on, and the summary recorded the new
    # values for the whole run); the checkpoint records them
    for changed, difference in ((["--length", "32"], "length 64 -> 32"),
                                (["--padding-insertion"], "padding_insertion False -> True"),
                                (["--beta", "0.5"], "beta 1.0 -> 0.5")):
        again = tmp_path / f"again-{changed[0]}"
        shutil.copytree(straight / "checkpoints" / "checkpoint-2", again / "checkpoints" / "checkpoint-2")
        result = runner.invoke(app, common + ["--output-dir", str(again), "--max-steps", "4", "--resume", *changed])
        assert result.exit_code == 1 and "saved by a run with other settings" in result.output, result.output
        assert difference in " ".join(result.output.split()), result.output
    result = runner.invoke(app, common + ["--output-dir", str(tmp_path / "none"), "--resume"])
    assert result.exit_code == 1 and "no checkpoint" in result.output
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\x00\x01")
    result = runner.invoke(app, common + ["--output-dir", str(tmp_path / "x"), "--corpus", str(bad)])
    assert result.exit_code == 1 and "corpus file" in result.output and "binary" in result.output


def test_rss_distillation_adds_the_span_loss_and_the_teacher_reads_its_mask(tiny_source, tmp_path):
    """`distill --rss`: the student is a span-selection model trained on RSS + attention KL; where the student reads
    [QUESTION] the teacher reads its mask token, and [QUESTION] starts as that token's embedding."""
    from transformers import AutoTokenizer

    from longbird.heads import LongBirdForSpanSelection
    from longbird.training.rss import QUESTION_TOKEN

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(f"the law number {i % 7} says that the state shall protect rights." for i in range(80)))
    out = tmp_path / "run"
    result = runner.invoke(app, ["distill", "--teacher", str(tiny_source), "--preset", "littlebird", "--max-length",
                                 "256", "--corpus", str(corpus), "--length", "64", "--batch-size", "2",
                                 "--max-steps", "2", "--logging-steps", "1", "--save-steps", "0", "--rss",
                                 "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "model" / "longbird_distill.json").read_text())
    logged = [entry for entry in summary["log_history"] if "loss" in entry]
    assert summary["objective"] == "rss + attention" and len(logged) == 2
    for entry in logged:  # the logged loss is the sum of its parts (beta = 1)
        assert entry["task_loss"] > 0 and entry["attention_kl"] > 0
        assert entry["loss"] == pytest.approx(entry["task_loss"] + entry["attention_kl"], rel=1e-3)
    model = LongBirdForSpanSelection.from_pretrained(out / "model")
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    assert QUESTION_TOKEN in tokenizer.get_vocab() and model.get_input_embeddings().weight.shape[0] == len(tokenizer)

    # The teacher sees its mask token where the student sees [QUESTION]: the loss equals one computed by hand that way.
    teacher = _teacher().double()  # fp64 models; the KL itself is taken in fp32
    student = longbird.convert(teacher, preset="full", max_length=256).double()
    input_ids, attention_mask = make_batch(40, batch=2)
    question = teacher.config.vocab_size  # an id only the student has
    student.resize_token_embeddings(question + 1)
    with torch.no_grad():
        student.get_input_embeddings().weight[question] = student.get_input_embeddings().weight[4]
    marked = input_ids.clone()
    marked[:, 5:35] = question  # many, so that reading another token there moves the attention visibly
    loss, _ = distillation_loss(teacher, student, {"input_ids": marked, "attention_mask": attention_mask},
                                teacher_ids={question: 4})
    plain, _ = distillation_loss(teacher, student, {"input_ids": marked.masked_fill(marked == question, 4),
                                                    "attention_mask": attention_mask})
    zero = kl_rounding_bound(40)  # identical student: zero both ways, up to the fp32 rounding of the KL
    assert abs(loss.item()) <= zero and abs(plain.item()) <= zero
    wrong, _ = distillation_loss(teacher, student, {"input_ids": marked, "attention_mask": attention_mask},
                                 teacher_ids={question: 7})
    assert wrong.item() > zero  # the teacher read something else there: more than rounding can explain


def test_slope_learning_rate_puts_the_bialibi_slopes_in_their_own_group():
    from longbird.heads import LongBirdForSpanSelection
    from longbird.training.trainer import LongBirdTrainer
    from transformers import TrainingArguments

    model = LongBirdForSpanSelection(longbird.convert(make_source("bert"), preset="littlebird", max_length=256,
                                                      block_size=BLOCK).config)
    arguments = TrainingArguments(output_dir="unused", learning_rate=1e-4, use_cpu=True, report_to=[])
    optimizer = LongBirdTrainer(model=model, args=arguments, slope_learning_rate=1e-2).create_optimizer()
    slopes = {id(p) for n, p in model.named_parameters() if ".bialibi." in n}
    by_rate = {}
    for group in optimizer.param_groups:
        by_rate.setdefault(group["lr"], set()).update(id(p) for p in group["params"])
    assert by_rate[1e-2] == slopes and not (by_rate[1e-4] & slopes)
    assert len(by_rate[1e-4]) + len(slopes) == sum(1 for p in model.parameters() if p.requires_grad)
    default = LongBirdTrainer(model=model, args=arguments).create_optimizer()
    assert {group["lr"] for group in default.param_groups} == {1e-4}


def test_tape_learning_rate_puts_every_tape_map_in_its_own_group():
    """The TAPE maps (W_post, the feed-forward maps, the phase clock and gate: every `tape_*` parameter) train at
    `tape_learning_rate` without weight decay, everything else at the run's rate; a model without TAPE, or no rate,
    leaves Trainer's groups alone; a rate that is not positive is refused by the settings."""
    from transformers import TrainingArguments

    from longbird.heads import LongBirdForQuestionAnswering
    from longbird.training.finetune import FinetuneSettings
    from longbird.training.trainer import LongBirdTrainer

    arguments = TrainingArguments(output_dir="unused", learning_rate=1e-4, use_cpu=True, report_to=[])
    model = LongBirdForQuestionAnswering(longbird.convert(make_source("bert"), preset="tape", attention="bigbird",
                                                          max_length=256, block_size=BLOCK).config)
    tape = {id(p) for n, p in model.named_parameters() if "tape_" in n}
    names = {n.split(".layer.0.")[-1] for n, _ in model.named_parameters() if "tape_" in n and ".layer.0." in n}
    assert {"attention.self.tape_post", "tape_ffn.tape_ffn_in", "tape_ffn.tape_ffn_out",
            "tape_ffn.tape_ffn_gate.weight", "tape_phase.tape_phase_gate",
            "tape_phase.tape_phase_clock.weight"} <= names, names
    optimizer = LongBirdTrainer(model=model, args=arguments, tape_learning_rate=1e-3).create_optimizer()
    by_rate = {}
    for group in optimizer.param_groups:
        by_rate.setdefault(group["lr"], set()).update(id(p) for p in group["params"])
        if group["lr"] == 1e-3:
            assert group["weight_decay"] == 0.0
    assert by_rate[1e-3] == tape and not (by_rate[1e-4] & tape)
    assert len(by_rate[1e-4]) + len(tape) == sum(1 for p in model.parameters() if p.requires_grad)
    plain = LongBirdForQuestionAnswering(longbird.convert(make_source("bert"), preset="kobigbird", max_length=256,
                                                          block_size=BLOCK).config)
    groups = LongBirdTrainer(model=plain, args=arguments, tape_learning_rate=1e-3).create_optimizer().param_groups
    assert {group["lr"] for group in groups} == {1e-4}
    with pytest.raises(ValueError, match="--tape-learning-rate must be a positive number"):
        FinetuneSettings(tape_learning_rate=0.0)


def test_padding_insertion_moves_only_the_students_positions(tiny_source, tmp_path):
    """Padding Insertion in distillation: the student reads gapped position ids, the teacher the plain ones (so an
    identical student is no longer identical, and only through its positions); the CLI trains with it."""
    teacher = _teacher()
    student = longbird.convert(teacher, preset="full", max_length=256)
    input_ids, attention_mask = make_batch(60, batch=2)
    gapped = torch.arange(60).expand(2, -1) + (torch.arange(60) >= 30).long() * 40  # a gap of 40 after token 29
    batch = {"input_ids": input_ids, "attention_mask": attention_mask}
    plain, _ = distillation_loss(teacher, student, batch)
    seen = []
    forward = teacher.forward
    teacher.forward = lambda *args, **kwargs: seen.append(kwargs) or forward(*args, **kwargs)
    moved, _ = distillation_loss(teacher, student, {**batch, "position_ids": gapped})
    zero = kl_rounding_bound(60)  # 0 without the gap, up to fp32 rounding; with it more than rounding can explain
    assert abs(plain.item()) <= zero and moved.item() > zero
    assert seen and all("position_ids" not in kwargs for kwargs in seen)  # the teacher reads its own positions

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(f"the law number {i} says that the state shall protect rights." for i in range(80)))
    result = runner.invoke(app, ["distill", "--teacher", str(tiny_source), "--preset", "littlebird", "--max-length",
                                 "256", "--corpus", str(corpus), "--length", "64", "--batch-size", "2",
                                 "--max-steps", "1", "--save-steps", "0", "--padding-insertion",
                                 "--output-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "run" / "model" / "longbird_distill.json").read_text())
    assert summary["settings"]["padding_insertion"] is True


def test_a_teacher_without_an_mlm_head_is_said_to_give_no_soft_targets(tmp_path):
    """all-MiniLM has no MLM head: --alpha and --temperature were ignored without a word while the summary said
    "attention (+ soft targets)"."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(f"the law number {i} says that the state shall protect rights." for i in range(40)))
    args = ["distill", "--teacher", "minilm", "--preset", "littlebird", "--max-length", "1024", "--corpus",
            str(corpus), "--length", "64", "--batch-size", "2", "--max-steps", "1", "--output-dir", str(tmp_path / "d")]
    with pytest.warns(UserWarning, match="--alpha 5 and --temperature 3 change nothing here: .* the teacher and the "
                                         "student have none"):
        result = runner.invoke(app, args + ["--alpha", "5", "--temperature", "3"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "d" / "model" / "longbird_distill.json").read_text())
    assert summary["objective"] == "attention only (no MLM head on the teacher and the student)"
    from longbird.sources import resolve_model_directory

    # the teacher as given, and where it was read (it recorded a site-packages path alone)
    assert summary["teacher"] == "minilm" and summary["teacher_directory"] == str(resolve_model_directory("minilm"))
