"""HTML preprocessing: the character map round-trips exactly, on generated HTML and on the real KorQuAD pages."""

import html
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from longbird.data.html import TAG_TOKENS, add_tag_tokens, plain_document, preprocess_html
from longbird.metrics.korquad import normalize_korquad_v2

KORQUAD = Path(__file__).resolve().parents[1] / "data" / "korquad"
PAGES = ["korquad2.1_dev_00.json", "korquad2.1_train_00.json"]

# (raw source, decoded text) pieces: plain characters and entities.
CHARACTERS = st.sampled_from(list("가나다라 abcXYZ019.?!,-\n\t") + ["  "])
ENTITIES = st.sampled_from([("&amp;", "&"), ("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&#44;", ","),
                            ("&#xAC00;", "가"), ("&nbsp;", "\xa0"), ("&copy;", "©")])
PIECE = st.one_of(CHARACTERS.map(lambda c: (c, c)), ENTITIES)
TEXT = st.lists(PIECE, min_size=1, max_size=8).map(lambda ps: ("".join(p[0] for p in ps), "".join(p[1] for p in ps)))
KEPT_TAGS = ["p", "div", "span", "b", "a", "h1", "h2", "ul", "li", "td", "th"]
DROPPED = ["script", "style", "nav", "footer"]


def render(node):
    """(raw html, visible decoded text) of a generated node."""
    kind = node[0]
    if kind == "text":
        return node[1]
    if kind == "comment":
        return f"<!-- {node[1]} -->", ""
    if kind == "dropped":
        tag, body = node[1], node[2]
        return f"<{tag}>var x = 1 < 2 && y;{body}</{tag}>", ""
    tag, attributes, children = node[1], node[2], node[3]
    parts = [render(child) for child in children]
    opening = f'<{tag} title="{attributes}">' if attributes else f"<{tag}>"
    return opening + "".join(p[0] for p in parts) + f"</{tag}>", "".join(p[1] for p in parts)


LEAF = st.one_of(TEXT.map(lambda t: ("text", t)), st.sampled_from(["note", "x > y"]).map(lambda c: ("comment", c)),
                 st.tuples(st.just("dropped"), st.sampled_from(DROPPED), st.sampled_from(["", "z"])))
TREE = st.recursive(LEAF, lambda children: st.tuples(st.just("tag"), st.sampled_from(KEPT_TAGS),
                                                     st.sampled_from(["", "a>b", "k"]), st.lists(children, max_size=4)),
                    max_leaves=12)
DOCUMENT = st.lists(TREE, min_size=1, max_size=4).map(
    lambda nodes: ("<html><body>" + "".join(render(n)[0] for n in nodes) + "</body></html>",
                   "".join(render(n)[1] for n in nodes)))


def real_characters(document):
    return [i for i in range(len(document.text)) if document.ends[i] > document.starts[i]]


def assert_character_map_is_exact(document):
    previous_end = 0
    for i in real_characters(document):
        start, end = document.starts[i], document.ends[i]
        assert start >= previous_end, "source ranges must be increasing and disjoint"
        previous_end = end
        raw = document.source[start:end]
        readings = {html.unescape(raw), "\ufffd" if raw == "\x00" else raw}
        if raw.startswith("&#") and raw.rstrip(";")[2:].isdigit():
            readings.add(chr(int(raw.rstrip(";")[2:])))  # lxml keeps control characters Python drops
        if document.text[i] == " ":
            assert any(r.isspace() for r in readings)
        else:
            assert document.text[i] in readings, (i, raw, document.text[i])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(DOCUMENT, st.data())
def test_generated_html_round_trips(generated, data):
    source, visible = generated
    document = preprocess_html(source)
    assert_character_map_is_exact(document)
    # The visible text (scripts, styles, comments, nav/footer dropped) survives in order, tag tokens aside.
    kept = "".join(document.text[i] for i in real_characters(document))
    assert "".join(kept.split()) == "".join(visible.split())
    # Any processed span maps to a source span that maps back to the same real characters.
    if document.text:
        a = data.draw(st.integers(0, len(document.text) - 1))
        b = data.draw(st.integers(a + 1, len(document.text)))
        span = document.to_source_span(a, b)
        inside = [i for i in real_characters(document) if a <= i < b]
        if span is None:
            assert not inside
        else:
            assert document.from_source_span(*span) == (inside[0], inside[-1] + 1)


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("field", ["context", "raw_html"])
def test_real_pages_map_exactly(page, field):
    record = json.loads((KORQUAD / page).read_text(encoding="utf-8"))["data"][0]
    document = preprocess_html(record[field])
    assert_character_map_is_exact(document)
    assert document.text.startswith("[h1] ")
    assert "function(" not in document.text and "<" not in document.text.replace("< ", "")


@pytest.mark.parametrize("page", PAGES)
def test_real_answers_map_to_processed_text_and_back(page):
    record = json.loads((KORQUAD / page).read_text(encoding="utf-8"))["data"][0]
    document = preprocess_html(record["context"])
    for qa in record["qas"]:
        answer = qa["answer"]
        start, end = answer["answer_start"], answer["answer_start"] + len(answer["text"])
        processed = document.from_source_span(start, end)
        assert processed is not None, qa["id"]
        back = document.source_text(*processed)
        # The mapped-back text is a substring of the gold span and scores as the same answer.
        assert back in answer["text"] and normalize_korquad_v2(back) == normalize_korquad_v2(answer["text"])
        assert normalize_korquad_v2(document.text[processed[0]:processed[1]]) == normalize_korquad_v2(answer["text"])


def test_tags_become_tokens_and_boilerplate_goes():
    source = ("<html><head><title>T</title><style>p{}</style></head><body><nav>menu</nav><h2>제목</h2>"
              "<p>첫 &amp; 둘</p><table><tr><th>키</th><td>값</td></tr></table><ul><li>하나</li></ul>"
              "<div class='navbox'>links</div><footer>foot</footer><script>x<y</script></body></html>")
    document = preprocess_html(source)
    assert document.text == "[h2] 제목 [p] 첫 & 둘 [table] [tr] [th] 키 [td] 값 [ul] [li] 하나"
    amp = document.text.index("&")
    assert document.source_text(amp, amp + 1) == "&amp;"
    whole = document.text.index("첫"), document.text.index("둘") + 1
    assert document.source_text(*whole) == "첫 &amp; 둘"
    assert document.to_source_span(0, 4) is None  # "[h2]" is not in the source


def test_plain_documents_map_to_themselves():
    document = plain_document("대한민국 헌법")
    assert document.text == "대한민국 헌법" and document.source_text(5, 7) == "헌법"
    assert document.from_source_span(5, 7) == (5, 7)


def test_tag_tokens_are_added_once_and_initialised_from_their_meaning():
    from transformers import BertConfig, BertModel, BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "paragraph", "list", "item", "table"]
    path = Path(__file__).parent / "_vocab_for_tags.txt"
    tokenizer = None
    try:
        path.write_text("\n".join(vocab))
        tokenizer = BertTokenizerFast(vocab=str(path))
    finally:
        path.unlink()
    model = BertModel(BertConfig(vocab_size=len(vocab), hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=16))
    added = add_tag_tokens(tokenizer, model)
    assert added == list(TAG_TOKENS.values()) and add_tag_tokens(tokenizer, model) == []
    table = model.get_input_embeddings().weight
    assert table.shape[0] == len(tokenizer) == len(vocab) + len(TAG_TOKENS)
    p, li = tokenizer.convert_tokens_to_ids("[p]"), tokenizer.convert_tokens_to_ids("[li]")
    assert tokenizer.tokenize("[p] paragraph") == ["[p]", "paragraph"]
    assert table[p].tolist() == pytest.approx(table[vocab.index("paragraph")].tolist())
    assert table[li].tolist() == pytest.approx(((table[6] + table[7]) / 2).tolist())


ADVERSARIAL = [
    "<script><!--\nvar x;//--></script><p>ok</p>", "<style><!-- p{} --></style><p>ok</p>", "<xmp>a<b</xmp><p>ok</p>",
    "<textarea><p>in</p></textarea><p>ok</p>", "<iframe><p>x</p></iframe><p>ok</p>", "<title>a<b</title><p>ok</p>",
    "<p>a ‹가나> b</p>", '<p title = "a>b">t</p>', '<p title=\n"x>y">t</p>', "<p>a<!-->b</p>", "<p>a<!-- x --!>b</p>",
    "<p>a\x00b</p>", "<p>a&#1;d</p>", "\ufeff<p>x</p>", "<p>a&ampy &copy b</p>", "<P>UP</P><BR/>x",
    "<p>unclosed<div>y", "text before<html><body>z</body></html>", "<pre>  a\r\n b</pre>", "<![CDATA[x<y]]><p>q</p>",
]


@pytest.mark.parametrize("source", ADVERSARIAL)
def test_awkward_markup_aligns_exactly(source):
    from longbird.data.html import _preprocess_html

    document = _preprocess_html(source)  # no fallback: the aligner itself must cope
    assert_character_map_is_exact(document)
    assert document.text


def test_unalignable_markup_falls_back_to_plain_text(monkeypatch, caplog):
    from longbird.data import html as html_module

    def fail(source):
        raise html_module.HtmlAlignmentError("simulated")

    monkeypatch.setattr(html_module, "_preprocess_html", fail)
    document = preprocess_html("<p>x</p>")
    assert document.text == "<p>x</p>" and "fell back to plain text" in caplog.text


@pytest.mark.parametrize("fragment, seen", [
    ("<p><b>신</b>중현</p>", "신중현"),
    ("<p>H<sub>2</sub>O</p>", "H2O"),
    ('<p>록 밴드 <a href="/wiki/시나위">시나위</a>의 리더이면서</p>', "록 밴드 시나위의 리더이면서"),
    ("<table><tr><td>1990</td><td>2000</td></tr></table>", "1990 2000"),  # cells: separate words on the page
    ("<div>첫 줄<br>둘째 줄</div>", "첫 줄 둘째 줄"),
    ("<p>문단</p><p>다음</p>", "문단 다음"),
    ("<p>a &amp; b <script>x()</script>c</p>", "a & b c"),
    ('<p>신<span class="noprint">[편집]</span>중현</p>', "신중현"),  # boilerplate the reader never read
    ("<p>  여러   칸\n공백 </p>", "여러 칸 공백"),
])
def test_an_html_answer_reads_as_the_reader_read_the_page(fragment, seen):
    document = preprocess_html(f"<html><body>{fragment}</body></html>")
    assert document.readable(0, len(document.text)) == seen


def test_an_answer_record_of_a_page_is_its_readable_span():
    from longbird.qa import Answer, answer_record

    page = '<html><body><p>록 밴드 <a href="/wiki/x">시나위</a>의 리더</p></body></html>'
    document = preprocess_html(page)
    start = document.text.index("시나위")
    end = document.text.index("리더") + 2
    low, high = document.to_source_span(start, end)
    answer = Answer(page[low:high], low, high, 1.0, readable=document.readable(start, end))
    record = answer_record(answer, is_html=True)
    assert record["answer"] == "시나위의 리더" and record["source_text"] == '시나위</a>의 리더'
    assert answer_record(Answer("<b>x</b>y", 0, 9, 1.0), is_html=True)["answer"] == "x y"  # no reading: tags dropped
    assert answer_record(Answer("a  b", 0, 4, 1.0, readable="a b"), is_html=False)["answer"] == "a  b"  # plain: as is
