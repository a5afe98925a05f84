"""HTML preprocessing for KorQuAD 2.x pages, with an exact character map back to the original HTML.

BeautifulSoup (lxml parser) decides what is text, what is boilerplate and where the structural tags are.
The processed text keeps the visible text, collapses whitespace and writes each structural tag as a tag
token such as ``[p]`` (added to the tokenizer as special tokens). Every processed character remembers the
half-open range of the original HTML it came from, so a span of processed text maps back to a substring
of the original ``context`` and an answer's character offsets map forward to processed characters.

The parser does not report source offsets, so the text nodes it yields are re-located in the original
string in document order: markup is skipped, entities are matched by their decoded value.
"""

from __future__ import annotations

import bisect
import html as html_lib
import logging
import re
import warnings
from dataclasses import dataclass, field

from bs4 import (
    BeautifulSoup,
    Comment,
    Declaration,
    Doctype,
    MarkupResemblesLocatorWarning,
    NavigableString,
    ProcessingInstruction,
    Tag,
)

from .tokens import add_special_tokens

logger = logging.getLogger(__name__)

# Structural tags kept as tokens (LittleBird A.2; KorQuAD 2.0 baseline).
TAG_TOKENS = {name: f"[{name}]" for name in ("h1", "h2", "p", "table", "tr", "td", "th", "ul", "ol", "li")}
# Words whose embeddings initialise each new tag token (see `add_tag_tokens`).
TAG_TOKEN_MEANINGS = {
    "h1": "title", "h2": "section heading", "p": "paragraph", "table": "table", "tr": "row", "td": "cell",
    "th": "header cell", "ul": "list", "ol": "numbered list", "li": "list item",
}
# Never text: scripts and styles, the head, and page furniture.
DROPPED_TAGS = frozenset({"script", "style", "head", "title", "noscript", "template", "nav", "footer", "header",
                          "aside", "iframe", "svg", "math", "button", "select", "form"})
_BOILERPLATE_HINT = re.compile(r"(^|[\s_-])(nav|navigation|navbox|footer|toc|sidebar|mw-jump|noprint)($|[\s_-])",
                               re.IGNORECASE)
# Elements that separate words visually even without whitespace in the source.
BLOCK_TAGS = frozenset({"div", "br", "hr", "h3", "h4", "h5", "h6", "dl", "dt", "dd", "caption", "tbody", "thead",
                        "tfoot", "section", "article", "main", "blockquote", "pre", "figure", "figcaption", "img"})
# Elements whose content the parser keeps as raw text ('<' inside is text, not a tag).
RAW_TEXT_TAGS = frozenset({"script", "style", "xmp", "plaintext", "textarea", "title", "iframe", "noembed",
                           "noframes", "noscript"})
_ENTITY = re.compile(r"&(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[A-Za-z][A-Za-z0-9]*;?)")
_COMMENT_END = "-->"


@dataclass
class ProcessedDocument:
    """Processed text plus, per character, the half-open source range [starts[i], ends[i]).

    Characters that do not come from the source (tag tokens, separators between blocks) have an empty
    range (starts[i] == ends[i]).
    """

    source: str
    text: str
    starts: list[int]
    ends: list[int]
    _real: list[int] = field(init=False, repr=False)  # indices of characters that come from the source
    _real_ends: list[int] = field(init=False, repr=False)

    def __post_init__(self):
        if not len(self.text) == len(self.starts) == len(self.ends):
            raise ValueError("text, starts and ends must have the same length")
        self._real = [i for i in range(len(self.text)) if self.ends[i] > self.starts[i]]
        self._real_ends = [self.ends[i] for i in self._real]

    def to_source_span(self, start: int, end: int) -> tuple[int, int] | None:
        """Source range covering processed characters [start, end), or None if none comes from the source."""
        lo = bisect.bisect_left(self._real, start)
        hi = bisect.bisect_left(self._real, end)
        if lo >= hi:
            return None
        return self.starts[self._real[lo]], self.ends[self._real[hi - 1]]

    def source_text(self, start: int, end: int) -> str:
        """The substring of the original source behind processed characters [start, end) ("" if none)."""
        span = self.to_source_span(start, end)
        return "" if span is None else self.source[span[0]:span[1]]

    def readable(self, start: int, end: int) -> str:
        """What a person reads of processed characters [start, end), as the page shows them: the characters that come
        from the source (entities decoded, text of boilerplate never there), every character that does not (a
        separator at a block or cell, a tag token such as [td]) a space, whitespace collapsed. Inline tags add
        nothing: `<b>신</b>중현` reads 신중현."""
        pieces = (self.text[i] if self.starts[i] < self.ends[i] else " " for i in range(start, end))
        return " ".join("".join(pieces).split())

    def from_source_span(self, start: int, end: int) -> tuple[int, int] | None:
        """Processed range [a, b) of the characters whose source range overlaps [start, end), or None."""
        lo = bisect.bisect_right(self._real_ends, start)  # first real char ending after `start`
        hi = lo
        while hi < len(self._real) and self.starts[self._real[hi]] < end:
            hi += 1
        if lo >= hi:
            return None
        return self._real[lo], self._real[hi - 1] + 1


def plain_document(text: str) -> ProcessedDocument:
    """A plain-text document maps to itself."""
    return ProcessedDocument(text, text, list(range(len(text))), list(range(1, len(text) + 1)))


class HtmlAlignmentError(ValueError):
    pass


def _is_boilerplate(tag: Tag) -> bool:
    if tag.name in DROPPED_TAGS:
        return True
    if tag.get("role") in ("navigation", "contentinfo", "banner"):
        return True
    hints = " ".join([tag.get("id") or ""] + list(tag.get("class") or []))
    return bool(hints and _BOILERPLATE_HINT.search(hints))


def _skip_markup(source: str, pos: int) -> int:
    """If `source[pos:]` starts with a tag, comment or declaration, return the index after it; else `pos`."""
    if source.startswith("<!--", pos):
        for short in ("<!-->", "<!--->"):  # legal empty comments
            if source.startswith(short, pos):
                return pos + len(short)
        ends = [i for i in (source.find("-->", pos + 4), source.find("--!>", pos + 4)) if i >= 0]
        if not ends:
            return len(source)
        end = min(ends)
        return end + (3 if source.startswith("-->", end) else 4)
    if pos + 1 < len(source) and source[pos] == "<" and (_is_ascii_letter(source[pos + 1]) or source[pos + 1] in "/!?"):
        quote, after_equals = None, False
        for i in range(pos + 1, len(source)):
            ch = source[i]
            if quote:
                if ch == quote:
                    quote = None
            elif ch in "\"'" and after_equals:
                quote = ch
            elif ch == ">":
                return i + 1
            if not quote:
                after_equals = ch == "=" or (after_equals and ch.isspace())
        return len(source)
    return pos


def _is_ascii_letter(ch: str) -> bool:
    return "a" <= ch.lower() <= "z"


def _decode_entity(entity: str) -> list[str]:
    """What a parser may have made of an entity: html.unescape's reading, and for numeric references the raw
    code point (lxml keeps control characters that Python's unescape drops)."""
    readings = [html_lib.unescape(entity)]
    numeric = re.fullmatch(r"&#([xX][0-9a-fA-F]+|[0-9]+);?", entity)
    if numeric:
        value = numeric.group(1)
        code = int(value[1:], 16) if value[0] in "xX" else int(value)
        if 0 < code <= 0x10FFFF:
            readings.append(chr(code))
    return [r for r in readings if r and r != entity]


class _Aligner:
    """Walks the source string once, locating each parsed text node in order."""

    def __init__(self, source: str):
        self.source = source
        self.pos = 0

    def _entity_at(self, text: str, i: int) -> tuple[int, str] | None:
        """(end, decoded) of the character reference at the cursor that yields text[i:...], if any. Without a
        ';', the shortest reading wins ("&ampy" is "&" then "y"), as browsers read legacy entities."""
        match = _ENTITY.match(self.source, self.pos)
        if not match:
            return None
        ends = [match.end()] if match.group(0).endswith(";") else range(self.pos + 2, match.end() + 1)
        for end in ends:
            decoded = next((d for d in _decode_entity(self.source[self.pos:end]) if text.startswith(d, i)), None)
            if decoded:
                return end, decoded
        return None

    def locate(self, text: str, raw_text: bool = False) -> list[tuple[int, int]]:
        """Source range of each character of `text`. Markup is skipped before characters are matched,
        except inside raw-text elements (script, style, ...) once their first character has matched."""
        source, spans, i = self.source, [], 0
        while i < len(text):
            if self.pos >= len(source):
                raise HtmlAlignmentError(f"parsed text {text[i:i + 30]!r} not found in the source after offset "
                                         f"{self.pos}")
            ch = source[self.pos]
            if ch == "&":
                entity = self._entity_at(text, i)
                if entity:
                    end, decoded = entity
                    spans.extend([(self.pos, end)] * len(decoded))
                    i += len(decoded)
                    self.pos = end
                    continue
            # In raw text, '<' is text once the content has started (or starts right here).
            raw_here = raw_text and (i > 0 or source.startswith(text[:16], self.pos))
            if ch == "<" and not raw_here:
                after = _skip_markup(source, self.pos)
                if after > self.pos:
                    self.pos = after
                    continue
            # The parser replaces NUL and may rewrite whitespace in whitespace-only nodes (tab -> space).
            if ch == text[i] or (ch == "\x00" and text[i] == "\ufffd") or (ch.isspace() and text[i].isspace()):
                spans.append((self.pos, self.pos + 1))
                i += 1
                self.pos += 1
                continue
            if ch == "\r" and text[i] == "\n":  # the parser normalises CRLF and CR to LF
                end = self.pos + (2 if source.startswith("\r\n", self.pos) else 1)
                spans.append((self.pos, end))
                i += 1
                self.pos = end
                continue
            if ch.isspace() or ch in "\r\x00\ufeff":
                self.pos += 1  # whitespace, a NUL or a byte-order mark the parser dropped
                continue
            raise HtmlAlignmentError(
                f"cannot align parsed text {text[i:i + 30]!r} with the source at offset {self.pos} "
                f"({source[self.pos:self.pos + 30]!r})"
            )
        return spans


def preprocess_html(source: str) -> ProcessedDocument:
    """Visible text of `source` with tag tokens, whitespace collapsed, and the character map.

    If the parsed text cannot be located in the source (markup the aligner does not model), the page is
    logged and read as plain text: spans still map exactly, only the markup stays visible.
    """
    try:
        return _preprocess_html(source)
    except HtmlAlignmentError as error:
        logger.warning("HTML preprocessing fell back to plain text: %s", error)
        return plain_document(source)


def _preprocess_html(source: str) -> ProcessedDocument:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MarkupResemblesLocatorWarning)
        soup = BeautifulSoup(source, "lxml")
    aligner = _Aligner(source)
    units: list[tuple[str, int, int]] = []  # (character, start, end)

    def emit_separator():
        units.append((" ", aligner.pos, aligner.pos))

    def walk(node, dropped: bool):
        for child in node.children:
            if isinstance(child, (Comment, Doctype, Declaration, ProcessingInstruction)):
                continue
            if isinstance(child, NavigableString):
                # Dropped text is located too, to move past it.
                spans = aligner.locate(str(child), raw_text=getattr(child.parent, "name", None) in RAW_TEXT_TAGS)
                if not dropped:
                    units.extend((ch, start, end) for ch, (start, end) in zip(str(child), spans))
                continue
            if not isinstance(child, Tag):
                continue
            child_dropped = dropped or _is_boilerplate(child)
            token = TAG_TOKENS.get(child.name)
            if not child_dropped and (token or child.name in BLOCK_TAGS):
                emit_separator()
                if token:
                    units.extend((ch, aligner.pos, aligner.pos) for ch in token)
                    emit_separator()
            walk(child, child_dropped)
            if not child_dropped and (token or child.name in BLOCK_TAGS):
                emit_separator()

    walk(soup, False)
    return _collapse_whitespace(source, units)


def _collapse_whitespace(source: str, units: list[tuple[str, int, int]]) -> ProcessedDocument:
    text, starts, ends = [], [], []
    for ch, start, end in units:
        if ch.isspace():
            if not text:
                continue  # leading whitespace
            if text[-1] == " ":
                if end > start:  # widen the kept space to real source whitespace
                    if ends[-1] == starts[-1]:
                        starts[-1], ends[-1] = start, end
                    elif start <= ends[-1] + 1:
                        ends[-1] = max(ends[-1], end)
                continue
            ch = " "
        text.append(ch)
        starts.append(start)
        ends.append(end)
    while text and text[-1] == " ":
        text.pop(), starts.pop(), ends.pop()
    return ProcessedDocument(source, "".join(text), starts, ends)


def add_tag_tokens(tokenizer, model=None) -> list[str]:
    """Add the tag tokens to `tokenizer` as special tokens and grow `model`'s embeddings to match.

    New rows start at the mean embedding of the word pieces of what the tag means ("paragraph",
    "list item", ...), so a fresh tag token is a plausible input rather than noise. Returns the tokens added.
    """
    added = add_special_tokens(tokenizer, model, list(TAG_TOKENS.values()))
    if model is not None and added:
        import torch

        table = model.get_input_embeddings().weight
        first_new = min(added.values())
        with torch.no_grad():
            for token, token_id in added.items():
                pieces = tokenizer(TAG_TOKEN_MEANINGS[token[1:-1]], add_special_tokens=False)["input_ids"]
                pieces = [p for p in pieces if p < first_new] or list(range(first_new))
                table[token_id] = table[pieces].mean(dim=0)
    return list(added)


def looks_like_html(document: str) -> bool:
    """Whether a document whose format was not given is HTML: it starts with '<' after whitespace and a byte-order
    mark (U+FEFF, which `str.strip` keeps)."""
    return document.lstrip().lstrip("\ufeff").lstrip()[:1] == "<"


def visible_text(fragment: str) -> str:
    """What a reader sees of an HTML fragment out of its page (the default distill corpus's pages, an answer whose
    processed reading is not at hand): tags dropped, entities decoded, whitespace collapsed, a space at every tag.
    An answer read in a page takes `ProcessedDocument.readable` instead, the page's own separators."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MarkupResemblesLocatorWarning)
        text = BeautifulSoup(fragment, "lxml").get_text(" ")
    return " ".join(text.split())
