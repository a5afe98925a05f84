"""Issue 11: one-line errors naming the file or option and the fix (exit 1, nothing written), refusals instead of
silent nonsense, readable and scriptable answers (CRLF offsets, JSON when nothing is found), `longbird.answer`."""

from __future__ import annotations

import codecs
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longbird.cli import app
from longbird.files import OUTPUT_MARKER
from longbird.tasks.qa import answer
from test_qa_cli import PAGES, tiny_qa, tiny_source  # noqa: F401  (fixtures)

runner = CliRunner()
KORQUAD1 = Path(__file__).resolve().parents[1] / "data" / "korquad" / "KorQuAD_v1.0_dev.json"


def _fails_in_one_line(args, *fragments):
    result = runner.invoke(app, args)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1, result.output
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert "BadParameter" not in lines[0] and "--debug" not in lines[0], lines[0]  # our own words, not a type name
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_bad_model_directories_are_named(tiny_qa, tmp_path):
    document = tmp_path / "doc.txt"
    document.write_text("문서", encoding="utf-8")
    for model in (tmp_path / "missing", tmp_path):
        _fails_in_one_line(["answer", "--model", str(model), "--document", str(document), "--question", "무엇?"],
                           "not a longbird or transformers model directory", str(model))


@pytest.mark.parametrize("content, fragment", [
    (b"", "is empty"), (b"  \n", "is empty"), (b"\x00\x01binary\x00", "is a binary file"),
    (b"\xfa\xfb not utf-8", "is not UTF-8 text"),
    (b"\xff\xfe\xfa odd", "starts as UTF-16 text but is not"),  # a UTF-16 mark, then an odd number of bytes
])
def test_unreadable_data_files_are_named(tiny_qa, tmp_path, content, fragment):
    data = tmp_path / "data.json"
    data.write_bytes(content)
    out = tmp_path / "eval"
    _fails_in_one_line(["evaluate", "--model", str(tiny_qa), "--data", str(data), "--out", str(out)], str(data), fragment)
    assert not out.exists()  # nothing written


def test_wrong_qa_format_suggests_the_right_one(tiny_qa, tmp_path):
    _fails_in_one_line(["evaluate", "--model", str(tiny_qa), "--data", str(KORQUAD1), "--out", str(tmp_path / "e")],
                       "KorQuAD 1.0 / SQuAD file", "--format korquad1")
    _fails_in_one_line(["evaluate", "--model", str(tiny_qa), "--data", str(PAGES[0]), "--format", "squad",
                        "--out", str(tmp_path / "e")], "KorQuAD 2.x file", "--format korquad2")
    lines = tmp_path / "records.jsonl"
    lines.write_text('{"text": "a", "label": 1}\n{"text": "b", "label": 0}\n', encoding="utf-8")
    _fails_in_one_line(["evaluate", "--model", str(tiny_qa), "--data", str(lines), "--format", "squad",
                        "--out", str(tmp_path / "e")], "is JSON Lines", "classification format")


def test_window_length_above_the_model_fails_before_loading(tiny_qa, tmp_path):
    document = tmp_path / "doc.txt"
    document.write_text("문서", encoding="utf-8")
    _fails_in_one_line(["answer", "--model", str(tiny_qa), "--document", str(tmp_path / "not-read.txt"),
                        "--question", "무엇?", "--window-length", "100000"],
                       "--window-length 100000 is above the model's maximum length 256")


def test_utf16_and_byte_order_marked_documents_read_as_their_text(tiny_qa, tmp_path):
    """A document saved as UTF-16 with its mark (Windows' "Unicode" text) reads as its text, and one with a UTF-8 mark
    as the text without it: the same answer and offsets as the plain UTF-8 file."""
    text = "<p>T-X 프로그램의 초기 물량은 350대이다.</p>"
    answers = {}
    for name, data in (("utf8", text.encode("utf-8")), ("utf8-bom", codecs.BOM_UTF8 + text.encode("utf-8")),
                       ("utf16", text.encode("utf-16")), ("utf16-be", codecs.BOM_UTF16_BE + text.encode("utf-16-be"))):
        document = tmp_path / f"{name}.html"
        document.write_bytes(data)
        result = runner.invoke(app, ["answer", "--model", str(tiny_qa), "--document", str(document), "--question",
                                     "초기 물량은?", "--json"])
        assert result.exit_code == 0, result.output
        answers[name] = json.loads(result.output)
    assert all(answers[name] == answers["utf8"] for name in answers), answers


def test_a_window_length_below_one_token_is_named_as_such(tiny_qa, tmp_path):
    for length in ("0", "-5"):
        _fails_in_one_line(["answer", "--model", str(tiny_qa), "--document", str(tmp_path / "not-read.txt"),
                            "--question", "무엇?", "--window-length", length],
                           f"--window-length {length} is not a length", "from 1 to 256")


def test_brackets_in_answers_paths_and_errors_are_printed_as_they_are(tiny_qa, tmp_path):
    """rich reads [b]...[/b] as markup: an answer or a path holding it crashed the command (a closing tag that
    matches none) or lost its brackets."""
    document = tmp_path / "[bold]doc[red].txt"
    text = "닫는 태그는 [/b] 입니다. 굵은 글씨는 [b]x[i]=[bold]y[/b] 이다."
    document.write_text(text, encoding="utf-8")
    result = runner.invoke(app, ["answer", "--model", str(tiny_qa), "--document", str(document), "--question",
                                 "닫는 태그는?"])
    assert result.exit_code == 0, result.output
    answer = next(line for line in result.output.splitlines() if line.startswith("answer: "))[len("answer: "):]
    assert answer in text  # printed as it is in the document, brackets and all
    assert "[bold]doc[red].txt" in result.output
    missing = tmp_path / "runs" / "[bold]typo[/]"
    _fails_in_one_line(["answer", "--model", str(missing), "--document", str(document), "--question", "무엇?"],
                       str(missing))


def test_an_answer_holding_markup_is_printed_as_it_is(capsys):
    """The answer line itself (the tiny reader above may pick a span without brackets): `[/b]` closing no tag made rich
    raise MarkupError, `[bold]` vanished."""
    from longbird.cli.qa import _print_answer

    for text in ("닫는 태그는 [/b]", "x[i]=[bold]y"):
        record = {"answer": text, "source_text": text, "start": 0, "end": len(text), "score": 1.0,
                  "probability": 0.5, "window_length": 512, "window_source": "trained"}
        _print_answer(record, document=Path("[bold]page[red].txt"), min_probability=0.0, as_json=False)
        out = capsys.readouterr().out
        assert f"answer: {text}" in out and "[bold]page[red].txt" in out


def test_serve_on_a_taken_port_or_a_bad_host_fails_in_one_line_before_loading(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # the model directory does not exist: the socket is bound before any model is loaded
        _fails_in_one_line(["serve", "--model", str(tmp_path / "not-loaded"), "--port", str(port)],
                           f"cannot listen on 127.0.0.1:{port}", "choose another --port")
    _fails_in_one_line(["serve", "--model", str(tmp_path / "not-loaded"), "--host", "999.1.1.1"],
                       "--host '999.1.1.1' is not an address", "use 127.0.0.1")


def test_refusals_instead_of_random_heads(tiny_qa, tiny_source, tmp_path):
    document = tmp_path / "doc.txt"
    document.write_text("T-X 프로그램의 초기 물량은 350대이다.", encoding="utf-8")
    base = tmp_path / "base"
    assert runner.invoke(app, ["convert", str(tiny_source), "--max-length", "256", "--out", str(base)]).exit_code == 0
    _fails_in_one_line(["answer", "--model", str(base), "--document", str(document), "--question", "몇 대?"],
                       "has no trained question-answering head", "longbird finetune-qa")
    records = tmp_path / "docs.jsonl"
    records.write_text('{"text": "a", "label": "x"}\n', encoding="utf-8")
    _fails_in_one_line(["evaluate", "--model", str(tiny_qa), "--task", "classification", "--data", str(records),
                        "--out", str(tmp_path / "e")], "has no trained classification head", "finetune-cls")
    _fails_in_one_line(["answer", "--model", str(tiny_qa), "--document", str(document), "--question", "  "],
                       "--question is empty")


def test_answer_offsets_count_crlf_and_json_on_no_answer(tiny_qa, tmp_path):
    text = "첫 줄입니다.\r\n둘째 줄: T-X 프로그램의 초기 물량은 350대이다.\r\n셋째 줄.\r\n"
    document = tmp_path / "crlf.txt"
    document.write_bytes(text.encode("utf-8"))
    result = runner.invoke(app, ["answer", "--model", str(tiny_qa), "--document", str(document),
                                 "--question", "초기 물량은?", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert text[record["start"]:record["end"]] == record["source_text"] == record["answer"]
    empty_page = tmp_path / "empty.html"
    empty_page.write_text("<html><body><p> </p><table><tr><td></td></tr></table></body></html>", encoding="utf-8")
    result = runner.invoke(app, ["answer", "--model", str(tiny_qa), "--document", str(empty_page),
                                 "--question", "무엇?", "--json"])
    assert result.exit_code == 1, result.output
    nothing = json.loads(result.stdout)
    assert nothing.pop("window_source") == "trained" and nothing.pop("window_length") > 0  # the windows it read
    assert nothing == {"answer": None, "source_text": None, "start": None, "end": None, "score": None,
                       "probability": None, "lexical_prior": None}


def test_python_answer_function(tiny_qa):
    context = json.loads(PAGES[1].read_text(encoding="utf-8"))["data"][0]["context"]
    record = answer(str(tiny_qa), document=context, question="T-X의 초기 물량은 몇 대입니까?")
    assert record["source_text"] == context[record["start"]:record["end"]]
    assert "<" not in record["answer"] and record["answer"].strip()
    with pytest.raises(ValueError, match="the question is empty"):
        answer(str(tiny_qa), document=context, question=" ")
    with pytest.raises(TypeError):  # by keyword only: Reader.answer takes (question, document), as pipelines do
        answer(str(tiny_qa), context, "T-X의 초기 물량은 몇 대입니까?")


def test_training_on_the_dev_side_of_the_split_is_warned(tiny_source, tmp_path, caplog):
    from longbird.training.finetune import FinetuneSettings
    from longbird.tasks.qa import finetune_qa

    settings = FinetuneSettings(max_steps=1, batch_size=1, progress=False)
    with caplog.at_level("WARNING", logger="longbird.tasks.qa"):
        finetune_qa(tiny_source, KORQUAD1, tmp_path / "all", data_format="korquad1", max_length=256, max_examples=2,
                    settings=settings)
    assert any("--split train" in record.getMessage() for record in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="longbird.tasks.qa"):
        finetune_qa(tiny_source, KORQUAD1, tmp_path / "train", data_format="korquad1", max_length=256, max_examples=2,
                    settings=settings, split="train")
    assert not any("--split train" in record.getMessage() for record in caplog.records)


def test_transformers_pipelines_run_longbird_models(tiny_source, tmp_path):
    """transformers 5 has no question-answering pipeline (longbird.answer stands in); these two work."""
    import torch
    from transformers import AutoModel, AutoTokenizer, pipeline

    import longbird  # noqa: F401  (registers the Auto classes)

    base = tmp_path / "base"
    assert runner.invoke(app, ["convert", str(tiny_source), "--max-length", "256", "--out", str(base)]).exit_code == 0
    extractor = pipeline("feature-extraction", model=str(base))
    features = torch.tensor(extractor("a long document about laws")[0])
    tokenizer, model = AutoTokenizer.from_pretrained(base), AutoModel.from_pretrained(base)
    with torch.no_grad():
        direct = model(**tokenizer("a long document about laws", return_tensors="pt")).last_hidden_state[0]
    torch.testing.assert_close(features, direct, atol=1e-5, rtol=1e-5)
    documents = tmp_path / "docs.jsonl"
    documents.write_text("".join(json.dumps({"text": f"document {i} about {label}", "label": label}) + "\n"
                                 for i, label in enumerate(["law", "bill"] * 3)), encoding="utf-8")
    classifier_dir = tmp_path / "cls"
    assert runner.invoke(app, ["finetune-cls", "--model", str(base), "--train", str(documents), "--out",
                               str(classifier_dir), "--max-steps", "1"]).exit_code == 0
    (result,) = pipeline("text-classification", model=str(classifier_dir))("document 9 about law")
    assert result["label"] in {"law", "bill"} and 0.0 <= result["score"] <= 1.0


def test_bf16_and_threads_options(tiny_qa, tmp_path):
    import torch

    document = tmp_path / "doc.txt"
    document.write_text("T-X 프로그램은 미국 공군의 고등훈련기 교체 사업이다. 초기 물량은 350대이다.", encoding="utf-8")
    args = ["answer", "--model", str(tiny_qa), "--document", str(document), "--question", "초기 물량은?", "--json"]
    threads = torch.get_num_threads()
    try:
        result = runner.invoke(app, ["--threads", "1"] + args + ["--bf16"])
        assert result.exit_code == 0, result.output
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    record = json.loads(result.stdout)
    assert document.read_text(encoding="utf-8")[record["start"]:record["end"]] == record["source_text"]
    result = runner.invoke(app, ["evaluate", "--model", str(tiny_qa), "--data", str(PAGES[0]), "--out",
                                 str(tmp_path / "e"), "--bf16"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("native", [False, True])
def test_bf16_on_a_cpu_without_bf16_arithmetic_is_warned_about(tiny_qa, tmp_path, monkeypatch, native):
    """--bf16 where bf16 is emulated (AVX2-only CPUs: measured ~75x slower than fp32) says so on stderr, for inference
    and training; the JSON answer on stdout stays parseable. Where bf16 is native nothing is said."""
    import longbird.precision
    from longbird.training.finetune import FinetuneSettings, check_training_device

    monkeypatch.setattr(longbird.precision, "native_bf16", lambda device: native)
    document = tmp_path / "doc.txt"
    document.write_text("T-X 프로그램은 미국 공군의 고등훈련기 교체 사업이다. 초기 물량은 350대이다.", encoding="utf-8")
    result = runner.invoke(app, ["answer", "--model", str(tiny_qa), "--document", str(document), "--question",
                                 "초기 물량은?", "--json", "--bf16", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    if native:
        assert "bf16" not in result.stderr
    else:
        assert "no bf16 arithmetic" in result.stderr and "leave out --bf16" in result.stderr
    json.loads(result.stdout)
    settings = FinetuneSettings(bf16=True, device="cpu")
    if native:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check_training_device(settings)
    else:
        with pytest.warns(UserWarning, match="no bf16 arithmetic"):
            check_training_device(settings)


@pytest.mark.parametrize("command", ["finetune-qa", "finetune-cls", "distill", "pretrain"])
@pytest.mark.parametrize("option, value, fragment", [
    ("--max-steps", "-5", "--max-steps must be at least 1; got -5"), ("--max-steps", "0", "got 0"),
    ("--learning-rate", "-1e-4", "--learning-rate must be a positive number"),
    ("--batch-size", "0", "--batch-size must be at least 1"),
    ("--logging-steps", "0", "--logging-steps must be at least 1"),
])
def test_invalid_training_numbers_are_refused_before_anything_runs(tiny_source, tmp_path, command, option, value,
                                                                   fragment):
    """Trainer reads any max_steps <= 0 as "train the epochs": --max-steps -5 trained a whole epoch and exited 0.
    Every training command now refuses it (and other impossible numbers) in one line, writing nothing."""
    data = {"finetune-qa": PAGES[0], "finetune-cls": tmp_path / "docs.jsonl"}
    (tmp_path / "docs.jsonl").write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n',
                                         encoding="utf-8")
    out = tmp_path / "out"
    if command in data:
        args = [command, "--model", str(tiny_source), "--train", str(data[command]), "--out", str(out)]
    elif command == "distill":
        args = [command, "--teacher", str(tiny_source), "--output-dir", str(out)]
    else:
        args = [command, "--model", str(tiny_source), "--output-dir", str(out)]
    _fails_in_one_line(args + [option, value], fragment)
    assert not out.exists()


@pytest.mark.parametrize("command", ["finetune-qa", "finetune-cls"])
def test_a_tape_learning_rate_needs_a_positive_number_and_a_tape_model(tiny_source, tmp_path, command):
    """--tape-learning-rate (the TAPE maps' own rate): 0 is refused before anything runs, and so is a rate for a model
    without TAPE maps (it would silently change nothing), in one line and without writing OUT."""
    data = {"finetune-qa": PAGES[0], "finetune-cls": tmp_path / "docs.jsonl"}[command]
    (tmp_path / "docs.jsonl").write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n',
                                         encoding="utf-8")
    out = tmp_path / "out"
    args = [command, "--model", str(tiny_source), "--train", str(data), "--out", str(out), "--max-steps", "1"]
    _fails_in_one_line(args + ["--tape-learning-rate", "0"], "--tape-learning-rate must be a positive number")
    _fails_in_one_line(args + ["--preset", "kobigbird", "--tape-learning-rate", "1e-3"],
                       "--tape-learning-rate sets the rate of a TAPE model's maps, and this model has none")
    assert not out.exists()
    result = runner.invoke(app, args + ["--preset", "tape", "--max-length", "256", "--tape-learning-rate", "1e-3"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("command", ["distill", "pretrain"])
def test_a_slope_learning_rate_that_is_not_positive_is_refused(tiny_source, tmp_path, command):
    """--slope-learning-rate (the BiALiBi slopes' own rate) 0 or below: refused in one line before anything runs, as
    --learning-rate is (it used to be handed to the optimiser as given)."""
    out = tmp_path / "out"
    source = ["--teacher" if command == "distill" else "--model", str(tiny_source)]
    _fails_in_one_line([command, *source, "--output-dir", str(out), "--slope-learning-rate", "0"],
                       "--slope-learning-rate must be a positive number")
    assert not out.exists()


def test_min_probability_turns_a_weak_answer_into_no_answer(tiny_qa, tmp_path):
    """`--min-probability`: the best span below it is 'no answer' (exit 1, null fields, how close it came); at 0 the
    same question is answered; a value outside [0, 1] is refused before the model loads."""
    document = tmp_path / "doc.txt"
    document.write_text("T-X 프로그램은 미국 공군의 고등훈련기 교체 사업이다. 초기 물량은 350대이다.", encoding="utf-8")
    args = ["answer", "--model", str(tiny_qa), "--document", str(document), "--question", "초기 물량은?", "--json"]
    answered = runner.invoke(app, args)
    assert answered.exit_code == 0, answered.output
    best = json.loads(answered.stdout)["probability"]
    assert 0.0 < best < 1.0
    refused = runner.invoke(app, args + ["--min-probability", str(min(1.0, best * 1.01 + 1e-6))])
    assert refused.exit_code == 1, refused.output
    record = json.loads(refused.stdout)
    assert record["answer"] is None and record["start"] is None and record["best_probability"] == pytest.approx(best)
    kept = runner.invoke(app, args + ["--min-probability", str(best * 0.99)])
    assert kept.exit_code == 0 and json.loads(kept.stdout)["answer"] == json.loads(answered.stdout)["answer"]
    plain = runner.invoke(app, args[:-1] + ["--min-probability", "1"])
    assert plain.exit_code == 1 and "no answer with probability ≥ 1" in plain.output
    _fails_in_one_line(args + ["--min-probability", "1.5"], "--min-probability must lie in [0, 1]; got 1.5")


def test_a_question_longer_than_the_reader_reads_is_warned_about(tiny_qa, tmp_path):
    """Questions are cut to their first tokens in every window (64, or fewer where a sparse window's global first block
    holds fewer); a 5,000-character question used to be cut without a word. The CLI warns on stderr (stdout stays
    JSON) and the record says how many tokens were read."""
    from longbird.data.features import MAX_QUESTION_TOKENS, question_token_count
    from longbird.data.features import question_token_cap
    from transformers import AutoConfig, AutoTokenizer

    document = tmp_path / "doc.txt"
    document.write_text("T-X 프로그램은 미국 공군의 고등훈련기 교체 사업이다. 초기 물량은 350대이다.", encoding="utf-8")
    args = ["answer", "--model", str(tiny_qa), "--document", str(document), "--json", "--question"]
    short = runner.invoke(app, args + ["초기 물량은?"])
    assert short.exit_code == 0 and "warning" not in short.stderr and "question_cut" not in json.loads(short.stdout)
    long = runner.invoke(app, args + ["초기 물량은 " * 1000 + "몇 대인가?"])
    record = json.loads(long.stdout)
    config = AutoConfig.from_pretrained(tiny_qa)
    cap = question_token_cap(config, record["window_length"])  # the tiny reader's windows are sparse
    assert cap == config.block_size - 1 < MAX_QUESTION_TOKENS
    assert record["question_cut"]["read"] == cap < record["question_cut"]["tokens"]
    assert f"only its first {cap} were read" in long.stderr
    medium = "초기 물량은 " * 15 + "몇 대인가?"
    assert cap < question_token_count(AutoTokenizer.from_pretrained(tiny_qa), medium) <= 100
    more = runner.invoke(app, args + [medium, "--max-question-tokens", "100"])  # beyond the first block: refused
    assert more.exit_code != 0 and f"at most {cap} question tokens fit there" in more.output
    fewer = json.loads(runner.invoke(app, args + ["초기 물량은 몇 대인가?", "--max-question-tokens", "2"]).stdout)
    assert fewer["question_cut"]["read"] == 2


def test_a_training_set_read_many_times_over_is_warned_about(tiny_source, tmp_path):
    """One question (one window) and 12 steps of 1 window: read 12 times, more than 10 passes is memorising. The run
    trains (the user may mean it) and warns; 8 steps (8 passes) does not."""
    from longbird.training.finetune import FinetuneSettings, repeated_passes

    assert repeated_passes(4, FinetuneSettings(max_steps=20, batch_size=2, gradient_accumulation_steps=3)) == 30.0
    assert repeated_passes(4, FinetuneSettings(epochs=50)) == 0.0  # --epochs is already a number of passes
    data = tmp_path / "one.json"
    data.write_text(json.dumps({"version": "1", "data": [{"title": "t", "paragraphs": [{
        "context": "T-X 프로그램의 초기 물량은 350대이다.", "qas": [{"id": "q1", "question": "초기 물량은?",
                                                                  "answers": [{"text": "350대", "answer_start": 17}]}]}]}]},
                               ensure_ascii=False), encoding="utf-8")
    args = ["finetune-qa", "--model", str(tiny_source), "--max-length", "128", "--train", str(data), "--format",
            "squad", "--batch-size", "1"]
    import warnings

    with pytest.warns(UserWarning, match=r"1 window\(s\) and 12 steps of 1 windows read each about 12 times"):
        result = runner.invoke(app, args + ["--max-steps", "12", "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", message=r"(?!the training set)")  # only ours is an error here
        result = runner.invoke(app, args + ["--max-steps", "8", "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output


def test_hints_are_spelled_as_the_options_a_user_types(tiny_source, tmp_path):
    """The library says `max_length=1024` (a Python argument); the CLI says `--max-length 1024` for the same error."""
    from longbird.cli import cli_spelling

    _fails_in_one_line(["convert", str(tiny_source), "--preset", "kobigbird", "--max-length", "1000",
                        "--out", str(tmp_path / "c")], "--max-length (1000) must be a multiple", "use --max-length 1024")
    assert cli_spelling("convert with random_blocks='transformers' for an export") == \
        "convert with --set random_blocks=transformers for an export"
    assert cli_spelling("doc_stride (900) must lie in 0..400") == "--doc-stride (900) must lie in 0..400"
    assert cli_spelling("a max_length_of 3") == "a max_length_of 3"  # only whole argument names
    assert cli_spelling("doc_stride (-1) must lie in 0..400") == "--doc-stride (-1) must lie in 0..400"
    assert cli_spelling("window_length 100000 must lie in 1..512") == "--window-length 100000 must lie in 1..512"
    assert cli_spelling("output directory x already exists; pass overwrite=True (--overwrite) to replace it") == \
        "output directory x already exists; pass --overwrite to replace it"
    _fails_in_one_line(["convert", str(tiny_source), "--preset", "kobigbird", "--max-length", "32",
                        "--out", str(tmp_path / "short")], "--max-length (32) is below the source length",
                       "use --max-length 64 or more")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / OUTPUT_MARKER).write_text("", encoding="utf-8")  # an earlier longbird output
    (tmp_path / "taken" / "kept.txt").write_text("kept", encoding="utf-8")
    line = _fails_in_one_line(["convert", str(tiny_source), "--preset", "kobigbird", "--max-length", "256",
                               "--out", str(tmp_path / "taken")], "already exists; pass --overwrite")
    assert "=True" not in line and (tmp_path / "taken" / "kept.txt").read_text(encoding="utf-8") == "kept"


def test_the_dev_side_warning_fires_only_for_files_scored_on_the_split(tiny_source, tmp_path, caplog):
    """Training on a whole KorQuAD 1.0 file warns that `evaluate --split dev` would score trained-on articles;
    training on KorQuAD 2.x pages (not scored that way) says nothing."""
    import logging

    from longbird.training.finetune import FinetuneSettings
    from longbird.tasks.qa import finetune_qa

    settings = FinetuneSettings(max_steps=1, batch_size=1, progress=False)
    with caplog.at_level(logging.WARNING, logger="longbird"):
        finetune_qa(tiny_source, PAGES[0], tmp_path / "pages", data_format="korquad2", max_length=128, settings=settings)
    assert "dev side of the by-article split" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="longbird"):
        finetune_qa(tiny_source, KORQUAD1, tmp_path / "korquad1", data_format="korquad1", max_length=128, max_examples=2,
                    settings=settings)
    assert "dev side of the by-article split" in caplog.text and "--split train" in caplog.text


@pytest.mark.parametrize("preset", ["littlebird", "tape"])
def test_export_of_a_preset_bigbird_cannot_hold_names_the_ones_it_can_and_the_alternatives(tiny_source, tmp_path,
                                                                                           preset):
    model = tmp_path / preset
    result = runner.invoke(app, ["convert", str(tiny_source), "--preset", preset, "--max-length", "128", "--out",
                                 str(model)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "exported"
    _fails_in_one_line(["export", str(model), "--out", str(out)], "the kobigbird and full presets",
                       "torch.export or torch.onnx.export")
    assert not out.exists()


def test_export_of_a_model_without_itc_global_blocks_names_the_reconversion(tiny_source, tmp_path):
    """hf-bigbird has BigBird ITC only: a `global_blocks=first-reads-source` model is refused, in the option spelling a
    user types, and nothing is written."""
    model = tmp_path / "q"
    result = runner.invoke(app, ["convert", str(tiny_source), "--preset", "kobigbird", "--max-length", "128", "--set",
                                 "global_blocks=first-reads-source", "--set", "block_size=16", "--out", str(model)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "exported"
    _fails_in_one_line(["export", str(model), "--out", str(out)], "only BigBird ITC's global blocks",
                       "--set global_blocks=itc")
    assert not out.exists()


def test_export_of_a_fine_tuned_reader_warns_that_the_head_stays_behind_and_a_missing_directory_is_named(
        tiny_qa, tmp_path, caplog):
    import logging

    from transformers import BigBirdModel

    out = tmp_path / "encoder"
    with caplog.at_level(logging.WARNING, logger="longbird"):
        result = runner.invoke(app, ["export", str(tiny_qa), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "LongBirdForQuestionAnswering" in caplog.text and "encoder only" in caplog.text
    assert "--format onnx" in caplog.text
    assert isinstance(BigBirdModel.from_pretrained(out), BigBirdModel)  # the encoder, loadable as such
    missing = tmp_path / "nope"
    line = _fails_in_one_line(["export", str(missing), "--out", str(tmp_path / "x")], str(missing),
                              "not a longbird or transformers model directory")
    assert "Repo id" not in line


def test_an_output_that_is_or_holds_the_model_read_is_refused_and_the_model_kept(tiny_qa, tiny_source, tmp_path):
    """`evaluate --model M --out M --overwrite` replaced M by its metrics (the weights gone); every command that reads
    a directory now refuses to write over it, inside it or around it, before the work."""
    import shutil

    model = tmp_path / "reader"
    shutil.copytree(tiny_qa, model)
    kept = sorted(path.name for path in model.iterdir())
    for args in (["evaluate", "--model", str(model), "--data", str(PAGES[0]), "--out", str(model), "--overwrite"],
                 ["evaluate", "--model", str(model), "--data", str(PAGES[0]), "--out", str(model / "eval")],
                 ["export", str(model), "--out", str(model), "--overwrite"],
                 ["convert", str(model), "--preset", "kobigbird", "--max-length", "256", "--out", str(tmp_path),
                  "--overwrite"],
                 ["finetune-qa", "--model", str(model), "--train", str(PAGES[0]), "--out", str(model),
                  "--overwrite", "--max-steps", "1"]):
        _fails_in_one_line(args, "which is being read", "choose another --out")
        assert sorted(path.name for path in model.iterdir()) == kept, args
    # without --overwrite too: "already exists; pass --overwrite" was said first, then refused when passed
    _fails_in_one_line(["finetune-qa", "--model", str(model), "--train", str(PAGES[0]), "--out", str(model),
                        "--max-steps", "1"], "which is being read", "choose another --out")
    student = tmp_path / "run" / "model"  # distilling further into the student's own directory
    shutil.copytree(tiny_source, student)
    (student / OUTPUT_MARKER).write_text("")  # as an earlier distill's student
    kept = sorted(path.name for path in student.iterdir())
    _fails_in_one_line(["distill", "--output-dir", str(tmp_path / "run"), "--teacher", str(tiny_source), "--student",
                        str(student), "--overwrite", "--max-steps", "1"], "which is being read", "choose another --out")
    assert sorted(path.name for path in student.iterdir()) == kept


@pytest.mark.parametrize("command", [["finetune-qa", "--train", str(PAGES[0])],
                                     ["finetune-cls", "--train", "{cls}"]])
def test_a_training_window_longer_than_the_model_is_refused_before_the_data_is_read(tiny_source, tmp_path, command):
    """It failed at the first step, or (short paragraphs) trained and recorded a window no `evaluate` could read."""
    data = tmp_path / "docs.jsonl"
    data.write_text('{"text": "좋은 문서", "label": "a"}\n{"text": "나쁜 문서", "label": "b"}\n', encoding="utf-8")
    out = tmp_path / "run"
    _fails_in_one_line([command[0], "--model", str(tiny_source), "--max-length", "256", "--window-length", "512",
                        *[str(data) if a == "{cls}" else a for a in command[1:]], "--out", str(out)],
                       "--window-length 512 does not fit the model, which reads at most 256 tokens",
                       "--max-length of at least 512")
    assert not out.exists()


def test_a_model_directory_without_a_tokenizer_is_named_as_such(tmp_path):
    """`longbird.convert(...).save_pretrained(dir)` writes no tokenizer: transformers then guessed at a missing
    sentencepiece."""
    import longbird

    model = tmp_path / "no-tokenizer"
    longbird.convert("minilm", preset="kobigbird", max_length=1024).save_pretrained(model)
    _fails_in_one_line(["finetune-qa", "--model", str(model), "--train", str(PAGES[0]), "--out", str(tmp_path / "o")],
                       f"{model} has a model but no tokenizer", "tokenizer.save_pretrained")


def test_a_source_without_tokenizer_files_is_converted_without_a_tokenizer_and_said_so(tiny_source, tmp_path):
    """transformers 5 builds an empty tokenizer of the config's model type for a directory without tokenizer files
    (5 special tokens: every word [UNK]); convert saved that beside the model and said nothing."""
    import shutil

    source = tmp_path / "weights-only"
    source.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_source / name, source / name)
    out = tmp_path / "long"
    result = CliRunner().invoke(app, ["convert", str(source), "--max-length", "256", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "no tokenizer found beside the source; saved the model only" in " ".join(result.output.split())
    assert (out / "model.safetensors").is_file()
    assert not any((out / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"))


def test_a_set_value_of_the_wrong_kind_is_named(tiny_source, tmp_path):
    _fails_in_one_line(["convert", str(tiny_source), "--set", "num_random_blocks=abc", "--out", str(tmp_path / "c")],
                       "--set num_random_blocks=abc: num_random_blocks takes a whole number (its default is 3)")
    _fails_in_one_line(["convert", str(tiny_source), "--set", "linked_windows=1", "--out", str(tmp_path / "c")],
                       "linked_windows takes true or false")
    assert not (tmp_path / "c").exists()


def test_export_of_a_directory_without_weights_names_what_is_missing(tiny_qa, tmp_path):
    import shutil

    partial = tmp_path / "config-only"
    partial.mkdir()
    shutil.copy(tiny_qa / "config.json", partial / "config.json")
    _fails_in_one_line(["export", str(partial), "--out", str(tmp_path / "x")], f"{partial} has a config.json but no "
                       "weights", "model.safetensors")
    assert not (tmp_path / "x").exists()


def test_convert_and_export_refuse_their_output_before_the_work(tiny_source, tiny_qa, tmp_path, monkeypatch):
    """An existing --out, a file, or a path through a file is refused before the model is converted or loaded (it
    was refused after the conversion, or after loading and tracing the model for ONNX)."""
    import longbird.checkpoints
    import longbird.export

    def never(*args, **kwargs):
        raise AssertionError("the work ran before the output was checked")

    monkeypatch.setattr(longbird.checkpoints, "convert", never)
    monkeypatch.setattr(longbird.export, "export_onnx", never)
    monkeypatch.setattr(longbird.export, "resolve_model_directory", never)
    taken, ours, a_file = tmp_path / "taken", tmp_path / "ours", tmp_path / "a-file"
    taken.mkdir()
    ours.mkdir()
    (ours / OUTPUT_MARKER).write_text("")  # an earlier longbird output
    a_file.write_text("mine")
    for command in (["convert", str(tiny_source)], ["export", str(tiny_qa), "--format", "onnx"],
                    ["export", str(tiny_qa), "--format", "hf-bigbird"]):
        _fails_in_one_line([*command, "--out", str(ours)], f"output directory {ours} already exists",
                           "pass --overwrite")
        for overwrite in ([], ["--overwrite"]):  # not "pass --overwrite" first, then refused with it
            _fails_in_one_line([*command, "--out", str(taken), *overwrite], f"refusing to replace {taken}",
                               "longbird did not write")
        _fails_in_one_line([*command, "--out", str(a_file)], f"refusing to write {a_file}: it is a file")
        _fails_in_one_line([*command, "--out", str(a_file / "sub")], f"{a_file} is a file, not a directory")
    assert a_file.read_text() == "mine" and not any(taken.iterdir())


def test_hf_bigbird_export_takes_longbird_models_only(tiny_source, tmp_path):
    """It loaded any directory LongBirdModel.from_pretrained would read: a BERT source, or a BigBird export of its own
    (with a pooler initialised at random), and wrote it with exit 0."""
    _fails_in_one_line(["export", str(tiny_source), "--format", "hf-bigbird", "--out", str(tmp_path / "x")],
                       f"{tiny_source} is not a longbird model (model_type 'bert'); convert it first")
    converted = tmp_path / "kobigbird"
    assert runner.invoke(app, ["convert", str(tiny_source), "--max-length", "256", "--out", str(converted)]).exit_code == 0
    exported = tmp_path / "hf"
    assert runner.invoke(app, ["export", str(converted), "--format", "hf-bigbird", "--out", str(exported)]).exit_code == 0
    _fails_in_one_line(["export", str(exported), "--format", "hf-bigbird", "--out", str(tmp_path / "again")],
                       "is a transformers BigBird model already")
    assert not (tmp_path / "x").exists() and not (tmp_path / "again").exists()


def test_hf_bigbird_export_of_a_tape_fine_tuning_names_tape(tiny_qa, tmp_path):
    """A TAPE PEFT directory (its record, no full weights) was told it had 'a config.json but no weights'."""
    import shutil

    from longbird.checkpoints import PEFT_RECORD

    peft = tmp_path / "peft"
    peft.mkdir()
    shutil.copy(tiny_qa / "config.json", peft / "config.json")
    (peft / PEFT_RECORD).write_text("{}")
    _fails_in_one_line(["export", str(peft), "--format", "hf-bigbird", "--out", str(tmp_path / "x")],
                       "holds a TAPE fine-tuning", "--format onnx")


def test_a_damaged_model_directory_names_the_file(tiny_source, tiny_qa, tmp_path):
    """json's and safetensors' own errors name no file ('Expecting property name ...', 'incomplete metadata, file not
    fully covered')."""
    import shutil

    for source in (tiny_source, tiny_qa):
        cut, garbled = tmp_path / f"{source.name}-cut", tmp_path / f"{source.name}-garbled"
        shutil.copytree(source, cut)
        shutil.copytree(source, garbled)
        weights = (cut / "model.safetensors").read_bytes()
        (cut / "model.safetensors").write_bytes(weights[: len(weights) // 2])
        (garbled / "config.json").write_text('{"model_type": "bert",\n oops}', encoding="utf-8")
        for command in (["convert"], ["export", "--format", "onnx"], ["export", "--format", "hf-bigbird"]):
            _fails_in_one_line([command[0], str(cut), *command[1:], "--out", str(tmp_path / "o")],
                               f"{cut / 'model.safetensors'} cannot be read", "damaged or was cut short")
            _fails_in_one_line([command[0], str(garbled), *command[1:], "--out", str(tmp_path / "o")],
                               f"{garbled / 'config.json'} is not valid JSON", "line 2 column 2")
    _fails_in_one_line(["evaluate", "--model", str(tmp_path / f"{tiny_qa.name}-cut"), "--data", str(PAGES[0]),
                        "--out", str(tmp_path / "o")], "model.safetensors cannot be read")
    assert not (tmp_path / "o").exists()


def test_a_bad_line_of_classification_data_is_one_line_naming_the_file(tiny_qa, tmp_path):
    records = tmp_path / "bad.jsonl"
    records.write_text('{"text": "좋은 문서", "label": "a"}\n{"text": oops}\n', encoding="utf-8")
    _fails_in_one_line(["evaluate", "--model", str(tiny_qa), "--task", "classification", "--data", str(records),
                        "--out", str(tmp_path / "o")], f"classification data file {records} is not valid JSON Lines",
                       "JSON parse error", "on line 2")  # the line counted from 1 (pyarrow's "row 1")


def test_evaluate_batch_size_below_one_is_named(tiny_qa, tmp_path):
    _fails_in_one_line(["evaluate", "--model", str(tiny_qa), "--data", str(PAGES[0]), "--batch-size", "0",
                        "--out", str(tmp_path / "o")], "--batch-size must be at least 1")


def test_the_launchers_world_size_counts_before_the_process_group_exists(monkeypatch):
    """The memorisation check runs before Trainer sets up the process group: the launcher's WORLD_SIZE counts the
    processes (it counted 1, and the warning never came under torchrun), trusted with LOCAL_RANK only (a scheduler
    may export WORLD_SIZE alone); no collective is tried without the group."""
    from longbird.training.processes import agreed_across_processes, world_size

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert world_size() == 1
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert world_size() == 2 and agreed_across_processes(3.5) == 3.5
    monkeypatch.setenv("WORLD_SIZE", "two")
    assert world_size() == 1


def test_warnings_read_as_errors_for_the_commands_time_only():
    import warnings

    import click

    from longbird.cli import plain_warnings

    before = warnings.formatwarning
    with click.Context(click.Command("x")) as ctx:
        plain_warnings(ctx)
        assert warnings.formatwarning(UserWarning("read 12 times"), UserWarning, "finetune.py", 216) == \
            "warning: read 12 times\n"
    assert warnings.formatwarning is before  # an in-process caller (pytest's summary) gets Python's format back
