"""finetune-qa -> evaluate -> answer, and finetune-cls -> evaluate, end to end on a tiny model with real text."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel
from typer.testing import CliRunner

from longbird.cli import app
from longbird.conversion import default_source
from longbird.heads import LongBirdForQuestionAnswering
from longbird.checkpoints import check_tokenizer

runner = CliRunner()
from longbird.demo import KONLPY

KORQUAD = Path(__file__).resolve().parents[1] / "data" / "korquad"
PAGES = [KORQUAD / "korquad2.1_dev_00.json", KORQUAD / "korquad2.1_train_00.json"]


def write_tiny_source(path, **config):
    """A tiny random BERT (hidden 32, L = 64) with the real all-MiniLM-L6-v2 WordPiece tokenizer, saved to `path`;
    `config` overrides BertConfig fields (e.g. dropout)."""
    tokenizer = AutoTokenizer.from_pretrained(default_source(), local_files_only=True)
    torch.manual_seed(0)
    BertModel(BertConfig(**{"vocab_size": len(tokenizer), "hidden_size": 32, "num_hidden_layers": 2,
                            "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 64,
                            **config})).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory):
    return write_tiny_source(tmp_path_factory.mktemp("tiny-source"))


@pytest.fixture(scope="module")
def tiny_qa(tiny_source, tmp_path_factory):
    out = tmp_path_factory.mktemp("qa") / "model"
    result = runner.invoke(app, ["finetune-qa", "--model", str(tiny_source), "--preset", "kobigbird",
                                 "--max-length", "256", "--train", str(PAGES[0]), "--train", str(PAGES[1]),
                                 "--out", str(out), "--max-steps", "3", "--batch-size", "2",
                                 "--negative-fraction", "0.5", "--padding-insertion"])
    assert result.exit_code == 0, result.output
    return out


def test_finetune_qa_saves_model_tokenizer_and_summary(tiny_qa, tiny_source):
    config = json.loads((tiny_qa / "config.json").read_text())
    assert config["model_type"] == "longbird" and config["qa_head"] == "conditional"
    tokenizer = AutoTokenizer.from_pretrained(tiny_qa)
    assert tokenizer.convert_tokens_to_ids("[table]") != tokenizer.unk_token_id  # HTML tag tokens were added
    model = LongBirdForQuestionAnswering.from_pretrained(tiny_qa)
    check_tokenizer(model, tokenizer)
    summary = json.loads((tiny_qa / "longbird_finetune.json").read_text())
    assert summary["train_examples"] == 3 and 0 < summary["training_windows"] < summary["windows"]
    # what made the model: data, format, split, source, and the loss of every logged step
    assert summary["data"] == [str(PAGES[0]), str(PAGES[1])] and summary["format"] == "korquad2"
    assert summary["split"] is None and summary["task"] == "qa"
    assert summary["source_model"]["model"] == str(tiny_source) and summary["source_model"]["preset_if_converted"] == "kobigbird"
    assert summary["settings"]["max_steps"] == 3 and any("train_loss" in entry for entry in summary["log_history"])
    # 3 steps, shorter than the default --logging-steps 20: the loss is still logged (at the last step)
    assert [entry["step"] for entry in summary["log_history"] if "loss" in entry] == [3]
    assert not any(p.name.startswith(".") for p in tiny_qa.parent.iterdir())  # no work or partial dirs left
    # trained further from a longbird model: nothing was converted (--preset and --max-length did not apply)
    from longbird.runs import model_record

    assert model_record(tiny_qa, "kobigbird", 4096) == {"model": str(tiny_qa), "preset_if_converted": None,
                                                        "max_length_if_converted": None}


def test_finetune_qa_refuses_to_overwrite(tiny_qa, tiny_source):
    result = runner.invoke(app, ["finetune-qa", "--model", str(tiny_source), "--train", str(PAGES[0]),
                                 "--out", str(tiny_qa), "--max-steps", "1"])
    assert result.exit_code == 1 and "already exists" in result.output and len(result.output.strip().splitlines()) == 1


def test_evaluate_writes_predictions_and_official_metrics(tiny_qa, tmp_path):
    result = runner.invoke(app, ["evaluate", "--model", str(tiny_qa), "--data", str(PAGES[0]),
                                 "--out", str(tmp_path / "eval")])
    assert result.exit_code == 0, result.output
    predictions = json.loads((tmp_path / "eval" / "predictions.json").read_text())
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    context = json.loads(PAGES[0].read_text(encoding="utf-8"))["data"][0]["context"]
    assert set(predictions) == {"66678", "57677"} and {"exact_match", "f1"} <= set(metrics)
    assert metrics["questions"] == 2 and metrics["model"] == str(tiny_qa) and metrics["data"] == str(PAGES[0])
    for text in predictions.values():
        assert text and text in context and "[p]" not in text
    # An existing output needs --overwrite, and --overwrite replaces only what longbird wrote.
    again = ["evaluate", "--model", str(tiny_qa), "--data", str(PAGES[0]), "--out", str(tmp_path / "eval")]
    assert runner.invoke(app, again).exit_code == 1
    assert runner.invoke(app, again + ["--overwrite"]).exit_code == 0
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    result = runner.invoke(app, again[:-1] + [str(foreign), "--overwrite"])
    assert result.exit_code == 1 and "refusing to replace" in result.output and "did not write" in result.output
    result = runner.invoke(app, again[:-1] + [str(foreign)])  # the real reason first (it said: pass --overwrite)
    assert result.exit_code == 1 and "did not write" in result.output and "pass overwrite" not in result.output
    assert (foreign / "notes.txt").read_text() == "keep me" and sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


def test_answer_reads_an_html_page_and_reports_the_span(tiny_qa, tmp_path):
    context = json.loads(PAGES[1].read_text(encoding="utf-8"))["data"][0]["context"]
    page = tmp_path / "page.html"
    page.write_text(context, encoding="utf-8")
    result = runner.invoke(app, ["answer", "--model", str(tiny_qa), "--document", str(page),
                                 "--question", "T-X의 초기 물량은 몇 대입니까?", "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output[result.output.index('{"answer"'):])
    assert answer["source_text"] == context[answer["start"]:answer["end"]] and answer["answer"]
    assert "<" not in answer["answer"] and 0 <= answer["probability"] <= 1
    plain = tmp_path / "page.txt"
    plain.write_text("T-X 프로그램은 미국 공군의 고등훈련기 교체 사업이다. 초기 물량은 350대이다.", encoding="utf-8")
    result = runner.invoke(app, ["answer", "--model", str(tiny_qa), "--document", str(plain), "--question", "몇 대?"])
    assert result.exit_code == 0 and "characters" in result.output


def test_tokenizer_model_mismatch_is_named(tiny_qa):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qa)
    tokenizer.add_tokens(["[new-token]"])
    with pytest.raises(ValueError, match="tokenizer/model mismatch"):
        check_tokenizer(LongBirdForQuestionAnswering.from_pretrained(tiny_qa), tokenizer)


def _law_and_bill_documents(path: Path):
    """Real documents: chunks of the constitution (law) and National Assembly bills (bill)."""
    law = (KONLPY / "kolaw" / "constitution.txt").read_text(encoding="utf-8")
    records = [{"text": law[i:i + 600], "label": "law"} for i in range(0, 3000, 600)]
    for bill in sorted((KONLPY / "kobill").glob("*.txt"))[:5]:
        records.append({"text": bill.read_text(encoding="utf-8")[:900], "label": "bill"})
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in records), encoding="utf-8")
    return path


def test_classification_finetune_and_evaluate(tiny_source, tmp_path):
    data = _law_and_bill_documents(tmp_path / "docs.jsonl")
    result = runner.invoke(app, ["finetune-cls", "--model", str(tiny_source), "--max-length", "256",
                                 "--window-length", "128", "--stride", "32",
                                 "--train", str(data), "--out", str(tmp_path / "cls"), "--max-steps", "2"])
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "cls" / "config.json").read_text())
    assert config["id2label"] == {"0": "bill", "1": "law"}
    summary = json.loads((tmp_path / "cls" / "longbird_finetune.json").read_text())
    assert summary["task"] == "classification" and summary["data"] == str(data) and summary["labels"] == ["bill", "law"]
    assert summary["source_model"]["model"] == str(tiny_source) and summary["documents"] == 10
    assert summary["settings"]["max_steps"] == 2 and summary["log_history"][-1]["step"] == 2
    result = runner.invoke(app, ["evaluate", "--task", "classification", "--model", str(tmp_path / "cls"),
                                 "--data", str(data), "--out", str(tmp_path / "cls-eval")])
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "cls-eval" / "metrics.json").read_text())
    records = json.loads((tmp_path / "cls-eval" / "predictions.json").read_text())
    predictions = [record["prediction"] for record in records]
    assert len(predictions) == 10 and set(predictions) <= {"law", "bill"} and metrics["documents"] == 10
    assert [record["gold"] for record in records] == ["law"] * 5 + ["bill"] * 5
    assert all(sum(record["scores"].values()) == pytest.approx(1.0) for record in records)
    assert 0.0 <= metrics["macro_f1"] <= 1.0 and metrics["accuracy"] == pytest.approx(
        sum(p == g for p, g in zip(predictions, ["law"] * 5 + ["bill"] * 5)) / 10)
    # read at the trained window and stride (it read the model's 256 with a stride of 128), as the server reads
    assert (metrics["window_length"], metrics["stride"], metrics["window_source"]) == (128, 32, "trained")
    from longbird.reader import Reader

    served = Reader(tmp_path / "cls").classify(json.loads(data.read_text(encoding="utf-8").splitlines()[0])["text"])
    assert {label["label"]: label["probability"] for label in served["labels"]} == pytest.approx(records[0]["scores"])

    # several files are one evaluation set (the second was dropped), with the fields named as in training
    renamed = tmp_path / "renamed.jsonl"
    renamed.write_text("\n".join(json.dumps({"body": r["text"], "kind": r["label"]}, ensure_ascii=False)
                                 for r in map(json.loads, data.read_text(encoding="utf-8").splitlines())),
                       encoding="utf-8")
    result = runner.invoke(app, ["evaluate", "--task", "classification", "--model", str(tmp_path / "cls"), "--data",
                                 str(data), "--data", str(renamed), "--text-field", "body", "--label-field", "kind",
                                 "--out", str(tmp_path / "two")])
    assert "has no 'body' field" in result.output and "--text-field" in result.output  # one field name for both
    result = runner.invoke(app, ["evaluate", "--task", "classification", "--model", str(tmp_path / "cls"), "--data",
                                 str(renamed), "--data", str(renamed), "--text-field", "body", "--label-field", "kind",
                                 "--out", str(tmp_path / "two")])
    assert result.exit_code == 0, result.output
    twice = json.loads((tmp_path / "two" / "predictions.json").read_text())
    scores = lambda rows: [row["scores"][label] for row in rows for label in ("bill", "law")]  # noqa: E731
    assert len(twice) == 20 and scores(twice) == pytest.approx(scores(records) * 2)
    # options of the other task were accepted and ignored
    for option in (["--max-examples", "2"], ["--format", "squad"], ["--scoring", "null-relative"],
                   ["--batch-size", "4"]):  # given, even at their defaults
        result = runner.invoke(app, ["evaluate", "--task", "classification", "--model", str(tmp_path / "cls"),
                                     "--data", str(data), "--out", str(tmp_path / "x"), *option])
        assert result.exit_code == 2 and f"{option[0]} applies to --task qa only" in result.output, result.output
    assert not (tmp_path / "x").exists()


def test_long_documents_are_mean_pooled_over_windows(tiny_source, tmp_path):
    from longbird.data.classification import document_windows
    from longbird.heads import LongBirdForSequenceClassification
    from longbird.training.finetune import PaddedBatches
    from longbird.checkpoints import load_task_model
    from longbird.tasks.classification import predict_documents

    model, tokenizer = load_task_model(tiny_source, LongBirdForSequenceClassification, "kobigbird", 256,
                                       num_labels=2)
    model.eval()
    text = (KONLPY / "kolaw" / "constitution.txt").read_text(encoding="utf-8")[:2000]
    windows = document_windows(tokenizer, text, 256, stride=32)
    assert len(windows) > 3
    pooled = predict_documents(model, tokenizer, [text], 256, stride=32)[0]
    with torch.no_grad():
        each = model(**PaddedBatches(0)(windows)).logits
    torch.testing.assert_close(pooled, each.mean(dim=0))


def test_malformed_classification_records_are_named(tmp_path):
    from longbird.data.classification import read_classification
    from longbird.data.korquad import MalformedRecordError

    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "좋은 문서", "label": "a"}\n{"text": "", "label": "b"}\n', encoding="utf-8")
    with pytest.raises(MalformedRecordError, match="record 2 of bad.jsonl"):  # counted from 1, as lines are
        read_classification(path)
    with pytest.raises(MalformedRecordError, match="no 'category' field"):
        read_classification(path, label_field="category")
    from longbird.data.classification import label_vocabulary

    assert label_vocabulary([1, 10, 2, 0]) == ["0", "1", "2", "10"]  # class id i is label i (as strings: 10 < 2)
    assert label_vocabulary(["b", "a", "10", "2"]) == ["10", "2", "a", "b"]  # names: alphabetical
    wide = tmp_path / "wide.jsonl"  # UTF-16 reads as text elsewhere; the dataset loaders take UTF-8 only
    wide.write_text('{"text": "좋은 문서", "label": "a"}\n', encoding="utf-16")
    with pytest.raises(ValueError, match="wide.jsonl is UTF-16 text; re-save it as UTF-8"):
        read_classification(wide)


def test_answer_on_an_explicit_device_equals_the_default(tiny_qa, tmp_path):
    plain = tmp_path / "page.txt"
    plain.write_text("T-X 프로그램은 미국 공군의 고등훈련기 교체 사업이다. 초기 물량은 350대이다.", encoding="utf-8")
    answers = []
    for device in (["--device", "cpu"], []):
        result = runner.invoke(app, ["answer", "--model", str(tiny_qa), "--document", str(plain), "--question", "몇 대?",
                                     "--json", *device])
        assert result.exit_code == 0, result.output
        answers.append(json.loads(result.output[result.output.index('{"answer"'):]))
    assert answers[0] == answers[1] or torch.cuda.is_available()  # auto is the CPU on a machine without CUDA


def test_the_lexical_prior_moves_the_answer_next_to_the_questions_words(tiny_qa, tmp_path):
    """With an overwhelming weight the answer of an untrained reader starts among the few tokens around the passage
    that shares the question's words, whatever the reader's own scores say; a negative weight is refused."""
    plain = tmp_path / "page.txt"
    opening = "첫째 문단은 사과와 배를 말한다. "
    document = opening + "날씨가 맑고 바람이 분다. " * 40 + "마지막 문단은 초기 물량 360대를 말한다."
    plain.write_text(document, encoding="utf-8")
    command = ["answer", "--model", str(tiny_qa), "--document", str(plain), "--question",
               "마지막 문단의 초기 물량은 몇 대인가?", "--json", "--lexical-radius", "6"]
    result = runner.invoke(app, command + ["--lexical-weight", "1000"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.output[result.output.index('{"answer"'):])
    assert record["start"] >= len(document) - 120, record
    result = runner.invoke(app, command + ["--lexical-weight", "-1"])
    assert result.exit_code == 2 and "--lexical-weight" in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the errors of a machine without CUDA")
def test_device_and_precision_options_fail_clearly_without_a_gpu(tiny_qa, tiny_source, tmp_path):
    result = runner.invoke(app, ["answer", "--model", str(tiny_qa), "--document", str(tmp_path / "x.txt"),
                                 "--question", "q", "--device", "cuda"])
    assert result.exit_code == 1 and result.output.startswith("error: --device cuda: CUDA is not available on this "
                                                              "machine")  # our message as is: no BadParameter:
    assert len(result.output.strip().splitlines()) == 1 and "--debug" not in result.output
    train = ["finetune-qa", "--model", str(tiny_source), "--train", str(PAGES[0]), "--out", str(tmp_path / "m")]
    result = runner.invoke(app, train + ["--fp16"])
    assert result.exit_code != 0 and "--fp16 mixed precision needs a CUDA GPU; use --bf16 on CPU" in result.output
    result = runner.invoke(app, train + ["--device", "cuda:1"])
    assert result.exit_code != 0 and "CUDA_VISIBLE_DEVICES" in result.output
    assert not (tmp_path / "m").exists()


def test_finetune_checkpoints_and_resume_reproduce_the_uninterrupted_losses(tiny_source, tmp_path):
    """A run killed after step 2 (only its checkpoint-2 survives) resumes with --resume to the same final weights."""
    import shutil

    def run(out, extra):
        return runner.invoke(app, ["finetune-qa", "--model", str(tiny_source), "--preset", "kobigbird", "--max-length",
                                   "256", "--train", str(PAGES[0]), "--out", str(out), "--max-steps", "4",
                                   "--batch-size", "2", "--save-steps", "2"] + extra)

    straight = tmp_path / "straight"
    assert run(straight, []).exit_code == 0
    checkpoints = tmp_path / "straight.checkpoints"
    assert (checkpoints / "checkpoint-2" / "tokenizer.json").is_file() and (checkpoints / "checkpoint-4").is_dir()
    resumed = tmp_path / "resumed"
    shutil.copytree(checkpoints / "checkpoint-2", tmp_path / "resumed.checkpoints" / "checkpoint-2")
    result = run(resumed, ["--resume"])
    assert result.exit_code == 0, result.output
    a, b = (LongBirdForQuestionAnswering.from_pretrained(p) for p in (straight, resumed))
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-5, msg=lambda m: f"{name}: {m}")


def test_held_out_check_refuses_a_reader_trained_without_a_split(tiny_qa, tmp_path):
    """E4/E7 score a reader on the dev side of the by-article split: the check reads the reader's own record, so a
    reader fine-tuned without --split (tiny_qa reads every article it was given) is refused, one trained on the train
    side passes, and one whose recorded training titles meet the held-out ones is refused by name."""
    from longbird.data.korquad import read_korquad_v1_articles, split_by_title
    from longbird.data.corpus import REPOSITORY_DATA
    from longbird.tasks.qa import require_trained_apart

    korquad = REPOSITORY_DATA / "korquad" / "KorQuAD_v1.0_dev.json"
    dev_titles = set(split_by_title(read_korquad_v1_articles(korquad)[0])["dev"]["title"])
    with pytest.raises(ValueError, match="split None"):
        require_trained_apart(tiny_qa, dev_titles)
    record = json.loads((tiny_qa / "longbird_finetune.json").read_text())
    reader = tmp_path / "reader"
    reader.mkdir()
    (reader / "longbird_finetune.json").write_text(json.dumps(record | {"data": str(korquad), "format": "korquad1",
                                                                        "split": "train"}))
    titles = require_trained_apart(reader, dev_titles)
    assert titles and not titles & dev_titles
    with pytest.raises(ValueError, match="held-out articles"):
        require_trained_apart(reader, dev_titles | {sorted(titles)[0]})


def test_cli_scoring_defaults_are_the_librarys():
    """The CLI spells the default rule out (importing qa would slow `longbird --help`); it must stay the library's."""
    import inspect

    from longbird import cli
    from longbird.qa import DEFAULT_SCORING, SCORING_RULES

    for command in (cli.answer, cli.evaluate):
        option = inspect.signature(command).parameters["scoring"].default
        assert option.default == DEFAULT_SCORING
        assert all(rule in option.help for rule in SCORING_RULES)
    from longbird.lexical_prior import DEFAULT_RADIUS, DEFAULT_WEIGHT

    for command in (cli.answer, cli.evaluate, cli.serve):
        parameters = inspect.signature(command).parameters
        assert (parameters["lexical_weight"].default, parameters["lexical_radius"].default) == \
            (DEFAULT_WEIGHT, DEFAULT_RADIUS)


def test_answer_and_evaluate_read_with_the_window_the_model_was_trained_at(tiny_source, tmp_path):
    """A model fine-tuned on 64-token windows of a 256-token model reads 64-token windows unless told otherwise (it
    never learnt to read 256); `--window-length` overrides, and the output says which window was used."""
    model = tmp_path / "qa64"
    result = runner.invoke(app, ["finetune-qa", "--model", str(tiny_source), "--preset", "kobigbird",
                                 "--max-length", "256", "--window-length", "64", "--doc-stride", "16",
                                 "--train", str(PAGES[0]), "--out", str(model), "--max-steps", "1",
                                 "--batch-size", "2", "--negative-fraction", "0.2"])
    assert result.exit_code == 0, result.output
    context = json.loads(PAGES[1].read_text(encoding="utf-8"))["data"][0]["context"]
    page = tmp_path / "page.html"
    page.write_text(context, encoding="utf-8")

    def ask(*extra):
        result = runner.invoke(app, ["answer", "--model", str(model), "--document", str(page),
                                     "--question", "T-X의 초기 물량은 몇 대입니까?", *extra])
        assert result.exit_code == 0, result.output
        return result.output

    def ask_json(*extra):
        output = ask("--json", *extra)
        return json.loads(output[output.index('{"answer"'):])

    default, explicit = ask_json(), ask_json("--window-length", "64", "--doc-stride", "16")
    assert default["window_length"] == 64 and default["window_source"] == "trained"
    assert {k: v for k, v in default.items() if k != "window_source"} == {
        k: v for k, v in explicit.items() if k != "window_source"}
    assert explicit["window_source"] == "given"
    assert "read in 64-token windows (the window it was fine-tuned at)" in ask()
    assert "read in 256-token windows (--window-length)" in ask("--window-length", "256")
    result = runner.invoke(app, ["evaluate", "--model", str(model), "--data", str(PAGES[0]), "--out",
                                 str(tmp_path / "eval")])
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["window_length"] == 64 and metrics["doc_stride"] == 16 and metrics["window_source"] == "trained"


def test_a_classifier_trained_further_keeps_its_labels_and_its_checkpoints_their_window(tiny_source, tmp_path):
    """Further fine-tuning of a classifier keeps its class ids (a fresh sorted order swapped the meaning of a head
    saved with another order), refuses labels it does not know in one line, and its checkpoints carry the trained
    window and stride, as a QA run's do."""
    import torch
    from safetensors.torch import load_file, save_file

    data = _law_and_bill_documents(tmp_path / "docs.jsonl")
    first = tmp_path / "cls"
    result = runner.invoke(app, ["finetune-cls", "--model", str(tiny_source), "--max-length", "256",
                                 "--window-length", "128", "--stride", "32", "--train", str(data), "--out",
                                 str(first), "--max-steps", "2", "--save-steps", "1"])
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "cls.checkpoints" / "checkpoint-1" / "longbird_finetune.json").read_text())
    assert (record["task"], record["window_length"], record["stride"]) == ("classification", 128, 32)
    for window, stride in ((256, 32), (64, 32), (48, 12)):  # the trained stride kept up to half a named window
        out = tmp_path / f"eval-{window}"
        result = runner.invoke(app, ["evaluate", "--task", "classification", "--model", str(first), "--data",
                                     str(data), "--window-length", str(window), "--out", str(out)])
        assert result.exit_code == 0, result.output
        metrics = json.loads((out / "metrics.json").read_text())
        assert (metrics["window_length"], metrics["stride"], metrics["window_source"]) == (window, stride, "given")
    result = runner.invoke(app, ["evaluate", "--task", "classification", "--model", str(first), "--data", str(data),
                                 "--stride", "8", "--out", str(tmp_path / "eval-stride")])  # finetune-cls's spelling
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "eval-stride" / "metrics.json").read_text())["stride"] == 8
    # the same classifier with its classes stored the other way round: rows swapped, names swapped
    swapped = tmp_path / "swapped"
    shutil.copytree(first, swapped)
    config = json.loads((swapped / "config.json").read_text())
    config["id2label"], config["label2id"] = {"0": "law", "1": "bill"}, {"law": 0, "bill": 1}
    (swapped / "config.json").write_text(json.dumps(config))
    weights = load_file(str(swapped / "model.safetensors"))
    head = [name for name in weights if name.startswith("classifier.") and weights[name].shape[0] == 2]
    assert head
    save_file({name: (tensor.flip(0).contiguous() if name in head else tensor) for name, tensor in weights.items()},
              str(swapped / "model.safetensors"), metadata={"format": "pt"})
    result = runner.invoke(app, ["finetune-cls", "--model", str(swapped), "--train", str(data), "--out",
                                 str(tmp_path / "again"), "--max-steps", "1", "--learning-rate", "1e-12"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "again" / "config.json").read_text())["id2label"] == {"0": "law", "1": "bill"}
    again = load_file(str(tmp_path / "again" / "model.safetensors"))
    for name in head:  # the rows kept their classes (a learning rate of 1e-12 moves nothing visible)
        torch.testing.assert_close(again[name], weights[name].flip(0), atol=1e-6, rtol=0)
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join(json.dumps({"text": f"문서 {i}", "label": label})
                               for i, label in enumerate(["law", "tax"])), encoding="utf-8")
    result = runner.invoke(app, ["finetune-cls", "--model", str(first), "--train", str(other), "--out",
                                 str(tmp_path / "taxes"), "--max-steps", "1"])
    assert result.exit_code == 1 and "labels it does not know: ['tax']" in result.output


def test_classification_records_of_several_formats_and_label_kinds(tiny_source, tmp_path):
    """JSON Lines and CSV files read as one test set; labels are one class each, text or whole numbers (1.0 is "1"),
    a list refused; a classifier with transformers' default names (LABEL_0, ...) scores integer labels by class id;
    a short training window works with the default stride."""
    from transformers import AutoModelForSequenceClassification

    from longbird.data.classification import read_classification
    from longbird.data.korquad import MalformedRecordError

    rows = [("좋은 법률 문서", 1), ("나쁜 법안 문서", 0), ("또 다른 법률", 1.0)]
    jsonl, csv = tmp_path / "a.jsonl", tmp_path / "b.csv"
    jsonl.write_text("\n".join(json.dumps({"text": t, "label": y}, ensure_ascii=False) for t, y in rows),
                     encoding="utf-8")
    csv.write_text("text,label\n" + "\n".join(f"{t},{int(y)}" for t, y in rows), encoding="utf-8")
    assert read_classification(jsonl)["label"] == ["1", "0", "1"]
    listed = tmp_path / "multi.jsonl"
    listed.write_text('{"text": "문서", "label": ["a", "b"]}\n', encoding="utf-8")
    with pytest.raises(MalformedRecordError, match="record 1 of multi.jsonl: 'label' is \\['a', 'b'\\]; a label is one"):
        read_classification(listed)
    model = tmp_path / "short"
    result = runner.invoke(app, ["finetune-cls", "--model", str(tiny_source), "--max-length", "256",
                                 "--window-length", "64", "--train", str(jsonl), "--out", str(model), "--max-steps",
                                 "1"])
    assert result.exit_code == 0, result.output  # the default stride fits a 64-token window (128 did not)
    assert json.loads((model / "longbird_finetune.json").read_text())["stride"] == 16
    default_names = tmp_path / "default-names"
    import longbird  # noqa: F401  (the Auto classes learn longbird)

    hf = AutoModelForSequenceClassification.from_pretrained(model)
    hf.config.id2label, hf.config.label2id = {0: "LABEL_0", 1: "LABEL_1"}, {"LABEL_0": 0, "LABEL_1": 1}
    hf.save_pretrained(default_names)
    shutil.copy(model / "tokenizer.json", default_names)
    shutil.copy(model / "tokenizer_config.json", default_names)
    for directory in (model, default_names):
        out = tmp_path / f"{directory.name}-eval"
        result = runner.invoke(app, ["evaluate", "--task", "classification", "--model", str(directory), "--data",
                                     str(jsonl), "--data", str(csv), "--out", str(out)])
        assert result.exit_code == 0, result.output
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["documents"] == 6 and "unseen_labels" not in metrics
    predictions = [json.loads((tmp_path / f"{d}-eval" / "predictions.json").read_text()) for d in ("short",
                                                                                                    "default-names")]
    assert [p["prediction"] for p in predictions[0]] == [p["prediction"] for p in predictions[1]]
    # data labelled with the default names themselves (a pipeline's output) keeps them: trained and scored as such
    named = tmp_path / "named.jsonl"
    named.write_text("\n".join(json.dumps({"text": t, "label": f"LABEL_{int(y)}"}, ensure_ascii=False)
                               for t, y in rows), encoding="utf-8")
    from datasets import Dataset

    from longbird.tasks.classification import evaluate_cls, finetune_cls

    finetune_cls(default_names, named, tmp_path / "named-model", max_length=256)  # its own labels: not refused
    scored = evaluate_cls(tmp_path / "named-model", Dataset.from_dict({"body": [t for t, _ in rows], "cat": [
        f"LABEL_{int(y)}" for _, y in rows]}), text_field="body", label_field="cat")  # a Dataset's own field names
    assert "unseen_labels" not in scored["metrics"] and set(scored["predictions"]) <= {"LABEL_0", "LABEL_1"}
