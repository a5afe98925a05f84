"""One engine for reading documents with a fine-tuned longbird model: `Reader(model_dir).answer(question, document)`.

`longbird answer`, `longbird serve` and the Python API call the same object, so an answer from the server is the
answer of the command line for the same model, document and question (tests/test_serve.py checks it). The model is
loaded once; every call windows the document (the trained window unless given, `reading_windows`), runs the
windows and ranks the spans of all windows with the cross-window scoring rule (`qa.rank_answers`).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .checkpoints import check_tokenizer, load_on_device
from .compilation import batch_multiple, encoder_is_compiled
from .data.batching import PaddedBatches
from .data.classification import document_windows
from .data.features import QAFeature, question_token_cap, question_token_count, question_token_limit
from .data.html import ProcessedDocument, looks_like_html
from .data.reading import text_problem
from .data.windows import PairTemplate
from .heads import LongBirdForQuestionAnswering, LongBirdForSequenceClassification
from .lexical_prior import DEFAULT_RADIUS, DEFAULT_WEIGHT, LexicalPrior
from .modeling import LongBirdModel
from .precision import bf16_autocast
from .qa import (
    DEFAULT_SCORING,
    WindowCandidates,
    answer_record,
    rank_answers,
    row_features,
    score_windows,
)
from .sources import resolve_model_directory, saved_config

# padded tokens per forward of `Reader.classify` and `Reader.embed`, and the server's default --max-batch-tokens
FORWARD_TOKENS = 16_384


def reading_windows(model, model_dir, window_length: int | None, doc_stride: int | None) -> tuple[int, int | None, str]:
    """(window_length, doc_stride, where the window came from: "given", "trained" or "model length")."""
    if window_length is not None:
        source = "given"
    else:
        window_length, trained_stride = trained_windows(model_dir) if model_dir is not None else (None, None)
        source = "trained" if window_length is not None else "model length"
        doc_stride = doc_stride if doc_stride is not None else trained_stride
    limit = model.config.max_position_embeddings
    window_length = limit if window_length is None else window_length  # 0 is a bad value, not "the default"
    if not 1 <= window_length <= limit:
        raise ValueError(f"window_length {window_length} must lie in 1..{limit} (the model's maximum length)")
    return window_length, doc_stride, source


def default_stride(window_length: int) -> int:
    """Tokens shared by neighbouring windows of a document read without a trained stride (classification, embedding,
    a sliding teacher): 128, or a quarter of a short window (what a window holds besides its special tokens)."""
    return min(128, window_length // 4)


def classification_windows(model, model_dir, window_length: int | None, stride: int | None) -> tuple[int, int, str]:
    """(window_length, stride, source) for classifying, as `reading_windows`: the trained window and stride unless
    given, else `default_stride`; a window named keeps the trained stride at the trained window or up to half it."""
    window_length, stride, source = reading_windows(model, model_dir, window_length, stride)
    if stride is None and source == "given" and model_dir is not None:  # a window named: the trained stride if it fits
        trained_window, trained = trained_windows(model_dir)
        fits = trained is not None and (window_length == trained_window or trained <= window_length // 2)
        stride = trained if fits else None
    return window_length, default_stride(window_length) if stride is None else stride, source


def trained_windows(model_path) -> tuple[int | None, int | None]:
    """(window_length, stride) a QA model or a classifier was fine-tuned with, from its `longbird_finetune.json`;
    (None, None) for a model without that record (converted or saved by hand), which then reads windows of its full
    length. Reading with the trained window is the default of `answer`, `evaluate` and the server: a model
    fine-tuned on 512-token windows has never been trained to read 4096 (design: the trained window, not the model
    length)."""
    record = resolve_model_directory(model_path) / "longbird_finetune.json"
    if not record.exists():
        return None, None
    data = json.loads(record.read_text(encoding="utf-8"))
    stride = {"qa": "doc_stride", "classification": "stride"}.get(data.get("task"))
    return (data.get("window_length"), data.get(stride)) if stride else (None, None)


@torch.no_grad()
def forward_windows(model, tokenizer, windows: list[dict], pick, module=None, pooled: bool = False) -> torch.Tensor:
    """`pick(outputs)` of `module` (default: the model) over `windows`, in padded batches of at most `FORWARD_TOKENS`
    (a document of thousands of windows in one batch would not fit in memory; each row reads alike in any batch);
    with `pooled`, the mean over every real token of all the windows of `pick`'s (B, l, h) states."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    collate = PaddedBatches(pad, batch_multiple(model))  # a compiled encoder: one kind of length
    per_batch = max(1, FORWARD_TOKENS // max(len(window["input_ids"]) for window in windows))
    picks, total, count = [], 0, 0
    for first in range(0, len(windows), per_batch):
        batch = {k: v.to(model.device) for k, v in collate(windows[first:first + per_batch]).items()}
        picked = pick((module or model)(**batch, return_dict=True))
        if not pooled:
            picks.append(picked.cpu())
            continue
        mask = batch["attention_mask"].to(picked.dtype)[..., None]
        total = total + (picked * mask).sum((0, 1))
        count = count + mask.sum()
    return torch.cat(picks) if not pooled else (total / count).cpu()


def predict_documents(model, tokenizer, texts, window_length: int, stride: int) -> list[torch.Tensor]:
    """Per document, the mean of its windows' logits (num_labels,) (windows: `classification_windows`), read as
    `forward_windows` reads (all of a long document's windows in one batch grew memory with its length)."""
    model.eval()
    return [forward_windows(model, tokenizer, document_windows(tokenizer, text, window_length, stride),
                            lambda out: out.logits.float()).mean(0) for text in texts]


def check_question(question: str) -> None:
    problem = text_problem(question or "", "ask a question about the document")
    if problem is not None:
        raise ValueError(f"the question {problem}")


def check_document(document: str, fix: str) -> None:
    problem = text_problem(document or "", fix)
    if problem is not None:
        raise ValueError(f"the document {problem}")


@dataclass
class Request:
    """A question about a document, windowed and checked, waiting for the model (`Reader.prepare`)."""

    features: list[QAFeature]
    documents: dict[str, ProcessedDocument]
    is_html: bool
    top_k: int  # answers wanted
    decode_top_k: int  # best starts decoded per window (at least the model's qa_top_k)
    max_answer_tokens: int | None
    window_length: int
    window_source: str
    question_cut: dict | None

    @property
    def tokens(self) -> int:
        return sum(len(feature.input_ids) for feature in self.features)


@dataclass
class Reading:
    """What one `Reader.answer` call found: `answers` (`qa.answer_record`s, best first, possibly empty), how many
    windows and tokens were read, the window used and where it came from, and `question_cut` when the question was
    longer than the windows read."""

    answers: list[dict]
    windows: int
    tokens: int
    window_length: int
    window_source: str
    question_cut: dict | None = None
    extra: dict = field(default_factory=dict)


class Reader:
    """A fine-tuned longbird QA model, loaded once, that answers questions about long documents.

    `Reader(model_dir, device=None, bf16=False, window_length=None, compile=False)` (device None: the CPU), or
    `Reader.of(model, tokenizer, model_dir)` for a model already loaded; `window_length` is the window of calls that
    name none (default: the window the model was fine-tuned at, else its length); `compile`: the encoder compiled
    with torch.compile (compilation.py); `bf16`: bf16 autocast, and a loaded model's encoder Linear weights stored
    in bf16 (`precision.store_encoder_linears_in`; `Reader.of` leaves the weights of a model it is given as they
    are); `lexical_weight` (0: off) and `lexical_radius`: the lexical prior across places (lexical_prior.py).
    `answer(question, document)` returns a `Reading`."""

    def __init__(self, model_dir, device: str | None = None, bf16: bool = False, scoring: str = DEFAULT_SCORING,
                 window_length: int | None = None, compile: bool = False, lexical_weight: float = DEFAULT_WEIGHT,
                 lexical_radius: int = DEFAULT_RADIUS):
        saved = saved_config(resolve_model_directory(model_dir))
        architectures = saved.get("architectures") or []
        for task_class in (LongBirdForQuestionAnswering, LongBirdForSequenceClassification):
            if task_class.__name__ in architectures:
                model, tokenizer = load_on_device(model_dir, task_class, device, compile=compile, bf16=bf16)
                break
        else:  # any other longbird model: its encoder, for `embed`
            model, tokenizer = load_on_device(model_dir, LongBirdModel, device, compile=compile, bf16=bf16,
                                              require_head=False)
        self._setup(model, tokenizer, model_dir, bf16, scoring, window_length, lexical_weight, lexical_radius)

    @property
    def task(self) -> str:
        """"qa", "classification" or "encoder" (what the loaded model can do beyond `embed`)."""
        if isinstance(self.model, LongBirdForQuestionAnswering):
            return "qa"
        return "classification" if isinstance(self.model, LongBirdForSequenceClassification) else "encoder"

    def _require(self, task: str, call: str) -> None:
        if self.task != task:
            raise ValueError(f"{call} needs a fine-tuned {'QA' if task == 'qa' else task} model; "
                             f"{self.model_dir or 'this model'} is a {self.task} model")

    @classmethod
    def of(cls, model, tokenizer, model_dir=None, bf16: bool = False, scoring: str = DEFAULT_SCORING,
           window_length: int | None = None, lexical_weight: float = DEFAULT_WEIGHT,
           lexical_radius: int = DEFAULT_RADIUS) -> Reader:
        reader = cls.__new__(cls)
        reader._setup(model, tokenizer, model_dir, bf16, scoring, window_length, lexical_weight, lexical_radius)
        return reader

    def _setup(self, model, tokenizer, model_dir, bf16: bool, scoring: str, window_length: int | None,
               lexical_weight: float, lexical_radius: int) -> None:
        check_tokenizer(model, tokenizer)
        self.model, self.tokenizer = model.eval(), tokenizer
        self.model_dir = None if model_dir is None else Path(model_dir)
        self.bf16, self.scoring = bf16, scoring
        # the lexical prior ranks answers: a QA model's only (None: off)
        self.lexical = (LexicalPrior.of(tokenizer, lexical_weight, lexical_radius)
                        if isinstance(model, LongBirdForQuestionAnswering) else None)
        # the window of calls that name none (None: the trained window, else the model length); checked now
        self.window_length = (reading_windows(model, model_dir, window_length, None)[0] if window_length is not None
                              else None)
        self.template = PairTemplate.of(tokenizer)
        # A fast tokenizer keeps its truncation and padding settings as state that each call sets: two threads
        # windowing at once can cut one document with the other's settings (a 5,428-token "window" was measured).
        self._tokenizing = threading.Lock()

    def windows_for(self, window_length: int | None = None,
                    doc_stride: int | None = None) -> tuple[int, int | None, str]:
        """(window_length, doc_stride, source) a call with these settings reads with; raises ValueError naming the
        model's limit."""
        if window_length is None and self.window_length is not None:
            return (*reading_windows(self.model, self.model_dir, self.window_length, doc_stride)[:2], "reader")
        return reading_windows(self.model, self.model_dir, window_length, doc_stride)

    def question_limit(self, window_length: int) -> int:
        return question_token_limit(self.model.config, window_length, len(self.template.prefix))

    def answer(self, question: str, document: str, *, is_html: bool | None = None, top_k: int = 1,
               max_answer_tokens: int | None = None, window_length: int | None = None, doc_stride: int | None = None,
               max_question_tokens: int | None = None) -> Reading:
        """The `top_k` best distinct answers to `question` in `document` (plain text or HTML; `is_html` None: HTML if
        it starts with `<`), each with character offsets into `document` as given."""
        request = self.prepare(question, document, is_html=is_html, top_k=top_k, max_answer_tokens=max_answer_tokens,
                               window_length=window_length, doc_stride=doc_stride,
                               max_question_tokens=max_question_tokens)
        with self._precision():
            windows = score_windows(self.model, request.features, top_k=request.decode_top_k,
                                    max_answer_tokens=request.max_answer_tokens)
        return self.finish(request, windows)

    def prepare(self, question: str, document: str, *, is_html: bool | None = None, top_k: int = 1,
                max_answer_tokens: int | None = None, window_length: int | None = None,
                doc_stride: int | None = None, max_question_tokens: int | None = None,
                window_limit: int | None = None) -> Request:
        """Everything of `answer` before the model runs: the checks and the windows (a server batches the windows of
        several requests, then `finish`es each). `window_limit`: data.window_limit.TooManyWindows, before any window
        is built, for a document that makes more windows."""
        self._require("qa", "answering")
        check_question(question)
        check_document(document, "give the text or HTML page to read")
        if top_k < 1:
            raise ValueError(f"top_k must be at least 1; got {top_k}")
        if max_answer_tokens is not None and max_answer_tokens < 1:
            raise ValueError(f"max_answer_tokens must be at least 1; got {max_answer_tokens}")
        window_length, doc_stride, source = self.windows_for(window_length, doc_stride)
        if max_answer_tokens is not None:  # no span is longer than its window (and 2**70 would overflow a tensor)
            max_answer_tokens = min(max_answer_tokens, window_length)
        cap = question_token_cap(self.model.config, window_length, len(self.template.prefix))
        if max_question_tokens is not None and cap is not None and max_question_tokens > cap:
            raise ValueError(f"--max-question-tokens {max_question_tokens} is more than this model reads: its "
                             f"{window_length}-token windows are sparse and only the first block is seen by every "
                             f"token, so at most {cap} question tokens fit there; give {cap} or fewer")
        max_question_tokens = max_question_tokens or self.question_limit(window_length)
        if is_html is None:
            is_html = looks_like_html(document)
        row = {"id": "question", "question": question, "context": document, "is_html": is_html}
        with self._tokenizing:
            features, documents = row_features(self.model, self.tokenizer, [row], window_length, doc_stride,
                                               max_question_tokens=max_question_tokens, window_limit=window_limit)
            question_tokens = question_token_count(self.tokenizer, question)
        cut = ({"tokens": question_tokens, "read": max_question_tokens} if question_tokens > max_question_tokens
               else None)
        return Request(features, documents, is_html, top_k, max(top_k, self.model.config.qa_top_k),
                       max_answer_tokens, window_length, source, cut)

    def finish(self, request: Request, windows: list[WindowCandidates]) -> Reading:
        """The answers of a prepared request from its decoded windows."""
        answers = rank_answers(windows, request.documents, self.scoring, request.top_k,
                               self.lexical).get("question", [])
        return Reading([answer_record(a, request.is_html) for a in answers], len(request.features), request.tokens,
                       request.window_length, request.window_source, request.question_cut)

    def classify(self, document: str, window_length: int | None = None, stride: int | None = None,
                 window_limit: int | None = None) -> dict:
        """Class probabilities of `document` (best first) from the mean of its windows' logits, as `evaluate --task
        classification` scores it (the trained window and stride unless given: `classification_windows`); `windows`
        read and their `tokens` (special tokens included); `window_limit` as in `prepare`."""
        self._require("classification", "classification")
        check_document(document, "give the text to classify")
        window_length = self.window_length if window_length is None else window_length  # the reader's, as windows_for
        window_length, stride, _ = classification_windows(self.model, self.model_dir, window_length, stride)
        with self._tokenizing:
            windows = document_windows(self.tokenizer, document, window_length, stride, window_limit)
        with self._precision():  # forward_windows runs without autograd
            logits = forward_windows(self.model, self.tokenizer, windows, lambda out: out.logits.float()).mean(0)
        probabilities = torch.softmax(logits, -1).tolist()
        labels = [{"label": self.model.config.id2label[i], "probability": p} for i, p in enumerate(probabilities)]
        return {"labels": sorted(labels, key=lambda item: -item["probability"]), "windows": len(windows),
                "tokens": sum(len(window["input_ids"]) for window in windows)}

    def embed(self, texts: list[str], pooling: str = "mean", window_length: int | None = None,
              normalize: bool = False, window_limit: int | None = None) -> dict:
        """One vector per text from the encoder's last hidden states: "mean" averages every real token of every
        window of the text (windows of `window_length`, `default_stride` tokens shared); "cls" is the first token of
        the first window. `normalize` scales each vector to unit length. `window_limit`: TooManyWindows, before any
        window of the text that passes it is built, where all the texts make more windows than that."""
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls'; got {pooling!r}")
        if not texts:
            raise ValueError("no text to embed; give at least one")
        for index, text in enumerate(texts):
            problem = text_problem(text or "", "every text to embed needs one")
            if problem is not None:
                raise ValueError(f"text {index} to embed {problem}")
        window_length = self.windows_for(window_length)[0]
        encoder = getattr(self.model, "longbird", self.model)
        vectors, tokens, read, left = [], 0, 0, window_limit  # the texts' windows together: each gets what is left
        for text in texts:
            with self._tokenizing:
                windows = document_windows(self.tokenizer, text, window_length, default_stride(window_length), left)
            left = None if left is None else left - len(windows)
            windows = windows[:1] if pooling == "cls" else windows  # cls reads the first window only
            tokens += sum(len(w["input_ids"]) for w in windows)
            read += len(windows)
            with self._precision():  # forward_windows runs without autograd
                if pooling == "cls":
                    vector = forward_windows(self.model, self.tokenizer, windows,
                                            lambda out: out.last_hidden_state[:, 0].float(), encoder)[0]
                else:
                    vector = forward_windows(self.model, self.tokenizer, windows,
                                            lambda out: out.last_hidden_state.float(), encoder, pooled=True)
            vectors.append(torch.nn.functional.normalize(vector, dim=-1) if normalize else vector)
        return {"embeddings": [v.tolist() for v in vectors], "dimension": int(vectors[0].shape[-1]),
                "windows": read, "tokens": tokens}

    @property
    def compiled(self) -> bool:
        """The encoder was compiled with torch.compile (`compile=True`, `--compile`): its first calls compile."""
        return encoder_is_compiled(self.model)

    def warm_up(self) -> list[dict]:
        """Read four synthetic documents the way requests are read, so that a compiled model compiles before the
        first real request rather than during it: one far shorter than a window (dense attention), one filling a
        window (sparse beyond the source length) and two of several windows (batches of several). torch.compile
        compiles the first shape it sees and recompiles with dynamic sizes when one changes; without a warm-up the
        first three requests of the compiled long reader took 27.7, 5.2 and 21.5 s (docs/serve.md). Shapes the
        warm-up does not bring can still compile later. Returns one record per document: its tokens, windows and
        seconds."""
        window_length = self.windows_for()[0]
        unit = "문서를 읽는다. "
        per_unit = max(1, len(self.tokenizer(unit, add_special_tokens=False)["input_ids"]))
        records = []
        # the full window leaves room for the question, the separators and a long reader's regional nulls (one per
        # 128 tokens past 512: 28 at 4,096)
        for tokens in (max(8, window_length // 8), window_length - max(16, window_length // 32),
                       window_length * 3 // 2, window_length * 5 // 2):
            document = unit * max(1, tokens // per_unit)
            started = time.perf_counter()
            if self.task == "qa":
                reading = self.answer("무엇을 읽는가?", document)
                windows, read = reading.windows, reading.tokens
            elif self.task == "classification":
                classified = self.classify(document)
                windows, read = classified["windows"], classified["tokens"]
            else:
                windows, read = None, self.embed([document])["tokens"]
            records.append({"tokens": read, "windows": windows, "seconds": time.perf_counter() - started})
        return records

    def _precision(self):
        return bf16_autocast(self.model.device.type, self.bf16)

    def info(self) -> dict:
        """What is being served: model directory, preset parts, lengths, head, dtype and device."""
        config = self.model.config
        window_length, _, source = self.windows_for()
        return {"model": str(self.model_dir) if self.model_dir else None, "task": self.task,
                "attention": config.attention,
                "position": config.position, "max_length": config.max_position_embeddings,
                "window_length": window_length, "window_source": source,
                "qa_head": config.qa_head if self.task == "qa" else None,
                "dtype": "bf16 autocast" if self.bf16 else str(next(self.model.parameters()).dtype).replace(
                    "torch.", ""), "device": str(self.model.device),
                "scoring": self.scoring if self.task == "qa" else None,
                "lexical_weight": self.lexical.weight if self.lexical else 0.0,
                "lexical_radius": self.lexical.radius if self.lexical else None,
                "labels": ([config.id2label[i] for i in range(config.num_labels)] if self.task == "classification"
                           else None)}
