"""Plain-text corpora for distillation and continued training: files, directories or JSON Lines ({"text": ...}),
cut into training windows of whole token sequences ([CLS] tokens [SEP], or the tokenizer's own specials).

The default corpus (`default_corpus`) is the Korean text of the repository: the whole articles of KorQuAD 1.0 (dev
set, paragraphs joined), the KorQuAD 2.1 pages (HTML reduced to visible text), the TyDi QA Korean documents and the
constitution and ten National Assembly bills shipped with the package (resources/konlpy-corpus). Its held-out
documents are the KorQuAD 1.0 articles of the by-article dev split (`split_by_title`, the split `finetune-qa --split`
uses), so a model pretrained on the rest can be fine-tuned and scored on KorQuAD without having read its test
articles. Outside a checkout (an installed wheel) only the packaged laws and bills remain.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .reading import read_text_file

DEFAULT_CORPUS = Path(__file__).resolve().parents[1] / "resources" / "konlpy-corpus"
# The repository's data/ folder (src/longbird/data/corpus.py -> repository root); absent in an installed wheel.
REPOSITORY_DATA = Path(__file__).resolve().parents[3] / "data"
TEXT_SUFFIXES = (".txt", ".md")


def corpus_files(paths) -> list[Path]:
    """The text and JSONL files under `paths` (files or directories, sorted), with a clear error for none."""
    files: list[Path] = []
    for path in [Path(p) for p in (paths if isinstance(paths, (list, tuple)) else [paths])]:
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES + (".jsonl",))
            if not found:
                raise FileNotFoundError(f"corpus directory {path} holds no .txt, .md or .jsonl files")
            files += found
        elif path.exists():
            files.append(path)
        else:
            raise FileNotFoundError(f"corpus file {path} does not exist")
    return files


def corpus_documents(paths) -> list[str]:
    """One string per document: a text file is one document, a JSONL file one per line (its "text" field)."""
    documents = []
    for file in corpus_files(paths):
        text = read_text_file(file, "corpus file")
        if file.suffix == ".json":  # a KorQuAD/SQuAD file given by mistake would be trained on as its raw JSON
            raise ValueError(f"corpus file {file} is a JSON document, not text: give plain-text files, or JSON Lines "
                             "(.jsonl) with a \"text\" field per line")
        if file.suffix != ".jsonl":
            documents.append(text)
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"corpus file {file}, line {number}: not JSON ({error.msg}); a .jsonl corpus holds "
                                 "one object with a \"text\" string per line (plain text: another suffix)") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f"corpus file {file}, line {number}: expected an object with a \"text\" string")
            documents.append(record["text"])
    return documents


def window_ends(tokenizer) -> tuple[int | None, int | None]:
    """The ids that open and close a window: [CLS]/[SEP] (BERT) or <s>/</s> (RoBERTa-family), None where absent."""
    first = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    last = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    return first, last


def corpus_windows(documents: list[str], tokenizer, length: int) -> list[dict]:
    """Every document cut into consecutive windows of at most `length` tokens including the special tokens."""
    first, last = window_ends(tokenizer)
    room = length - sum(token is not None for token in (first, last))
    if room < 1:
        raise ValueError(f"windows of {length} tokens leave no room for text")
    windows = []
    for document in documents:
        ids = tokenizer(document, add_special_tokens=False, verbose=False)["input_ids"]
        for start in range(0, len(ids), room):
            piece = (([first] if first is not None else []) + ids[start:start + room]
                     + ([last] if last is not None else []))
            windows.append({"input_ids": piece, "attention_mask": [1] * len(piece)})
    if not windows:
        raise ValueError("the corpus holds no text")
    return windows


def _split_by_order(documents: list[str], held_out: float) -> tuple[list[str], list[str]]:
    cut = max(1, round(len(documents) * held_out)) if len(documents) > 1 and held_out > 0 else 0
    return documents[cut:], documents[:cut]


def default_corpus_titled(data_dir: Path = REPOSITORY_DATA) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(training, held-out) documents of the default corpus as (title, text) pairs: the KorQuAD and TyDi titles,
    the file name of a packaged law or bill. Experiments record the titles to show what was held out."""
    from .html import visible_text
    from .korquad import read_korquad_v1_articles, split_by_title

    laws_and_bills = [(path.stem, read_text_file(path, "corpus file"))
                      for path in corpus_files(DEFAULT_CORPUS) if path.name != "SOURCE.md"]
    korquad1 = data_dir / "korquad" / "KorQuAD_v1.0_dev.json"
    if not korquad1.exists():
        return _split_by_order(laws_and_bills, 0.1)
    split = split_by_title(read_korquad_v1_articles(korquad1)[0])
    articles = {name: list({row["title"]: row["context"] for row in split[name]}.items()) for name in ("train", "dev")}
    pages = []
    for path in sorted((data_dir / "korquad").glob("korquad2*.json")):
        pages += [(record["title"], visible_text(record["context"]))
                  for record in json.loads(read_text_file(path, "corpus file"))["data"]]
    tydi = []
    for path in (data_dir / "tydiqa" / "tiny_dev.jsonl.gz", data_dir / "tydiqa" / "small_gold_annotation.jsonl"):
        if path.exists():
            tydi += [(record["document_title"],
                      (record.get("document_html") and visible_text(record["document_html"]))
                      or record["document_plaintext"])
                     for record in _json_lines(path) if record["language"] == "korean"]
    return articles["train"] + pages + tydi + laws_and_bills, articles["dev"]


def default_corpus(data_dir: Path = REPOSITORY_DATA) -> tuple[list[str], list[str]]:
    """(training, held-out) documents of the default Korean corpus (see the module docstring)."""
    training, held = default_corpus_titled(data_dir)
    return [text for _, text in training], [text for _, text in held]


def text_hash(text: str) -> str:
    """The SHA-256 of a text (UTF-8), as experiments record what they trained on and what they scored."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def held_out_record(train, dev) -> dict:
    """Titles and context hashes of both sides of a by-article split (rows with "title" and "context"), for a results
    file; AssertionError unless the sides share no title and no text (an experiment asserts its split with it)."""
    sides = {name: (sorted(set(rows["title"])), sorted({text_hash(c) for c in rows["context"]}))
             for name, rows in (("train", train), ("dev", dev))}
    shared_titles = set(sides["train"][0]) & set(sides["dev"][0])
    shared_texts = set(sides["train"][1]) & set(sides["dev"][1])
    if shared_titles or shared_texts:
        raise AssertionError(f"train and dev share {len(shared_titles)} titles and {len(shared_texts)} articles")
    return {f"{name}_{kind}": values[i] for name, values in sides.items()
            for i, kind in enumerate(("titles", "context_sha256"))}


def _json_lines(path: Path) -> list[dict]:
    import gzip

    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]


def corpus_split(paths=None, held_out: float = 0.1) -> tuple[list[str], list[str]]:
    """(training, held-out) documents: for None the default corpus, whose held-out articles are never training
    documents (with `held_out` 0 they are neither trained on nor scored); else the first `held_out` fraction of the
    given corpus's documents (in file order) held out."""
    if paths is None:
        training, held = default_corpus()
        return (training, held) if held_out > 0 else (training, [])
    return _split_by_order(corpus_documents(paths), held_out)
