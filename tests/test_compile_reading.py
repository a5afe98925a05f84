"""`--compile` for reading (issue 27, item 3): a reader whose encoder is compiled in place answers as the eager one,
through the Python API and `longbird answer --compile`, and the compiled model keeps its state-dict keys."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import longbird
from conftest import BLOCK, make_source
from longbird.cli import app as cli
from longbird.compilation import compile_encoder, one_graph
from longbird.data.korquad import read_korquad_v2
from longbird.reader import Reader
from test_qa_cli import PAGES, tiny_qa, tiny_source  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def page():
    row = read_korquad_v2(PAGES[0])[0][0]
    return row["context"][:6000], row["question"]  # a few windows of the tiny model's 256 tokens


def test_a_compiled_reader_answers_as_the_eager_one(tiny_qa, page, tmp_path):
    document, question = page
    eager = Reader(tiny_qa).answer(question, document, is_html=True, top_k=3)
    compiled_reader = Reader(tiny_qa, compile=True)
    compiled = compiled_reader.answer(question, document, is_html=True, top_k=3)
    assert eager.windows > 1
    assert [(a["start"], a["end"]) for a in compiled.answers] == [(a["start"], a["end"]) for a in eager.answers]
    for got, expected in zip(compiled.answers, eager.answers):
        # fp32 logits of unit-scale states through Inductor's reordered sums: ~1e-6 relative, far below 1e-4
        assert got["score"] == pytest.approx(expected["score"], abs=1e-4)
    path = tmp_path / "page.html"
    path.write_text(document, encoding="utf-8")
    result = CliRunner().invoke(cli, ["answer", "--model", str(tiny_qa), "--document", str(path), "--question",
                                      question, "--json", "--compile"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert (record["start"], record["end"]) == (eager.answers[0]["start"], eager.answers[0]["end"])


@pytest.mark.parametrize("preset", ["kobigbird", "littlebird", "tape"])
def test_compile_encoder_keeps_the_state_dict_and_says_which_presets_are_one_graph(preset):
    model = longbird.convert(make_source("bert"), preset=preset, max_length=256, block_size=BLOCK).eval()
    keys = list(model.state_dict())
    assert compile_encoder(model) is model
    assert list(model.state_dict()) == keys  # saves as a plain model: no "_orig_mod." prefix
    assert one_graph(model.config) == (preset != "kobigbird")
