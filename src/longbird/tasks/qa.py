"""Question answering as a task: read a dataset by format, fine-tune a reader, evaluate it with the official metric,
and answer one question about one document (`answer`). Span decoding lives in `longbird.qa`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from datasets import Dataset
from transformers import set_seed

from ..checkpoints import check_tokenizer, load_on_device, load_task_model, training_window
from ..data.features import question_token_limit
from ..data.html import add_tag_tokens, looks_like_html
from ..data.korquad import read_korquad_v1_articles, read_korquad_v2, read_squad_paragraphs, split_by_title
from ..data.layout_cuts import LayoutCuts
from ..data.null_regions import NullRegions
from ..data.window_groups import NEGATIVES, LinkedBatches, WindowGroups
from ..data.windows import PairTemplate, QAWindows
from ..heads import LongBirdForQuestionAnswering
from ..lexical_prior import DEFAULT_RADIUS, DEFAULT_WEIGHT
from ..metrics.korquad import korquad_v1, korquad_v2, squad_v1
from ..precision import bf16_autocast
from ..qa import DEFAULT_SCORING, predict_rows
from ..reader import Reader, check_question, default_stride, reading_windows, trained_windows
from ..runs import (
    check_output,
    data_record,
    describe_data,
    model_record,
    training_record,
    write_outputs,
    write_trained_model,
)
from ..training.finetune import FinetuneSettings, train
from ..training.processes import world_size

logger = logging.getLogger(__name__)
# korquad1 and squad are the published paragraphs; korquad1-articles joins each article into one context
DATA_FORMATS = ("korquad2", "korquad1-articles", "korquad1", "squad")

SPLIT_FORMATS = ("korquad1", "korquad1-articles", "squad")  # whose files are scored on the by-article dev side

def read_qa_data(path, data_format: str, split: str | None = None) -> tuple[Dataset, int]:
    """(questions, number of skipped records) of a dataset in one of DATA_FORMATS; `split` ("train"/"dev")
    takes one side of the fixed by-article split (`split_by_title`, seed 0, 20 % dev)."""
    if data_format == "korquad2":
        rows, skipped = read_korquad_v2(path)
    elif data_format in ("korquad1-articles", "korquad1", "squad"):
        if isinstance(path, (list, tuple)):
            raise ValueError(f"{data_format} data is one JSON file; got {len(path)} paths")
        reader = read_korquad_v1_articles if data_format.endswith("-articles") else read_squad_paragraphs
        rows, skipped = reader(path)
    else:
        raise ValueError(f"unknown data format {data_format!r}; use one of {DATA_FORMATS}")
    if split is None:
        return rows, len(skipped)
    if split not in ("train", "dev"):
        raise ValueError(f"--split must be train or dev; got {split!r}")
    return split_by_title(rows)[split], len(skipped)

def require_trained_apart(model_dir, held_titles, root: Path | None = None) -> set[str]:
    """The article titles a fine-tuned QA model was trained on, read from its own `longbird_finetune.json` (data,
    format, split); raises ValueError unless it was trained only on the train side of the by-article split and none
    of those titles is in `held_titles`. Relative data paths are tried as given, then under `root`."""
    record_path = Path(model_dir) / "longbird_finetune.json"
    if not record_path.exists():
        raise ValueError(f"{model_dir} has no longbird_finetune.json: what it was trained on cannot be checked")
    record = json.loads(record_path.read_text(encoding="utf-8"))
    if record.get("task") != "qa" or record.get("split") != "train":
        raise ValueError(f"{model_dir} was fine-tuned with split {record.get('split')!r} on {record.get('data')}: "
                         "only a reader trained on the train side (--split train) can be scored on the dev side")
    data = record["data"]
    paths = [Path(p) for p in (data if isinstance(data, list) else [data])]
    found = [p if p.exists() or root is None else Path(root) / p for p in paths]
    missing = [str(p) for p in found if not p.exists()]
    if missing:
        raise ValueError(f"the data {model_dir} was trained on is not here ({', '.join(missing)}): cannot check it")
    titles = set(read_qa_data(found if len(found) > 1 else found[0], record["format"], "train")[0]["title"])
    leaked = titles & set(held_titles)
    if leaked:
        raise ValueError(f"{model_dir} was trained on {len(leaked)} held-out articles, e.g. {sorted(leaked)[:3]}")
    return titles

def question_limit(model, tokenizer, window_length: int) -> int:
    """The most question tokens `model` reads in windows of `window_length` (`data.features.question_token_limit`: a
    sparse window keeps the whole question in the global first block)."""
    return question_token_limit(model.config, window_length, len(PairTemplate.of(tokenizer).prefix))

def sample_questions(rows: Dataset, n: int | None, seed: int = 0) -> Dataset:
    """`n` questions drawn with `seed` (all when n is None): a first-N cut would take a few articles only."""
    if n is None or n >= len(rows):
        return rows
    return rows.shuffle(seed=seed).select(range(n))

def finetune_qa(model_path, train_data, out: str | Path, *, data_format: str = "korquad2", preset: str = "kobigbird",
                max_length: int = 4096, window_length: int | None = None, doc_stride: int | None = None,
                max_windows: int | None = None, negative_fraction: float = 1.0, max_examples: int | None = None,
                settings: FinetuneSettings | None = None, overwrite: bool = False, qa_head: str | None = None,
                split: str | None = None, max_answer_tokens: int | None = None, teacher=None,
                teacher_weight: float = 0.5, teacher_temperature: float = 1.0, teacher_targets: str = "null-relative",
                conversion: dict | None = None, cut_windows: int | None = None, cut_overlap: int = 128,
                linked_groups: int | None = None, linked_negatives: str = "random") -> dict:
    """Fine-tune a QA model and save it (with its tokenizer, which gains the HTML tag tokens) to `out`.
    `window_length` (default: the model's maximum) is the feature window; `max_windows=1` trains on the first window
    only (truncation). With `teacher` (a fine-tuned short QA model directory) the loss mixes the gold labels with
    the teacher's span distributions read in sliding windows of its trained length (training/sliding_teacher.py),
    `teacher_weight` of the soft part at `teacher_temperature`; on cuts it reads each cut whole, and
    `teacher_targets` says what its start scores teach each region (training/cut_teacher.py). `conversion`:
    LongBirdConfig values for a source that is converted (e.g. {"tape_phase": False}); ignored by a longbird
    directory, which keeps its own.
    `cut_windows`: train on windows of this many tokens cut from the long windows (the model's first block, then
    consecutive tokens overlapping by about `cut_overlap`), each token with its long-window position and null
    (data/layout_cuts.py); the negative draw applies to the cuts.
    `linked_groups`: for a model with linked windows (`config.linked_windows`), train on groups of at most this many
    windows of one question (every window with the answer, the rest drawn from its others; data/window_groups.py),
    each group's rows linked in its batch; `settings.batch_size` counts groups. `negative_fraction` is not used then;
    `linked_negatives` says how the windows without the answer are chosen ("random", or "lexical": those that match
    the question best by BM25)."""
    from ..training.cut_teacher import TARGETS

    settings = settings or FinetuneSettings()
    if teacher_targets not in TARGETS:
        raise ValueError(f"--teacher-targets {teacher_targets!r} is not one of {', '.join(TARGETS)}")
    if teacher_targets != "null-relative" and (teacher is None or cut_windows is None):
        raise ValueError(f"teacher targets {teacher_targets!r} apply to a teacher reading cuts: give --teacher with "
                         "--cut-windows, or leave --teacher-targets out")
    if linked_groups is not None and (teacher is not None or cut_windows is not None):
        raise ValueError("--linked-windows trains groups of sliding windows; it does not combine with --teacher or "
                         "--cut-windows: leave those out")
    if linked_negatives not in NEGATIVES:
        raise ValueError(f"--linked-negatives {linked_negatives!r} is not one of {', '.join(NEGATIVES)}")
    if linked_negatives != "random" and linked_groups is None:
        raise ValueError(f"--linked-negatives {linked_negatives} chooses the windows of a linked group: give "
                         "--linked-windows N too, or leave --linked-negatives out")
    out = Path(out)
    check_output(out, overwrite, reads=(model_path, teacher))
    rows = train_data if isinstance(train_data, Dataset) else read_qa_data(train_data, data_format, split)[0]
    # The by-article split is the protocol of the KorQuAD 1.0 / SQuAD files (`evaluate --split dev`); a handful of
    # KorQuAD 2.x pages is not scored that way, so the warning would only be noise there.
    if split is None and not isinstance(train_data, Dataset) and len(rows) and data_format in SPLIT_FORMATS:
        dev_titles = set(split_by_title(rows)["dev"]["title"])
        if dev_titles:  # the same file scored with `evaluate --split dev` would then score trained-on questions
            logger.warning("training on all of %s: %d of its articles form the dev side of the by-article split "
                           "that `evaluate --split dev` scores; pass --split train to hold them out", train_data,
                           len(dev_titles))
    rows = sample_questions(rows, max_examples, settings.seed)
    # a saved head (and its answer-length limit) is kept unless another is asked for
    overrides = {**(conversion or {}), **{key: value for key, value in (("qa_head", qa_head),
                                                                        ("qa_max_answer_tokens", max_answer_tokens))
                                          if value is not None}}
    set_seed(settings.seed)  # a new head's initialisation is part of the run
    model, tokenizer = load_task_model(model_path, LongBirdForQuestionAnswering, preset, max_length, **overrides)
    add_tag_tokens(tokenizer, model)  # always, so the model can read HTML pages later (`longbird answer`)
    check_tokenizer(model, tokenizer)
    window_length = training_window(model, window_length)
    if linked_groups is not None and not model.config.linked_windows:
        raise ValueError(f"--linked-windows {linked_groups} trains linked windows, and {model_path} has no links: "
                         "convert the reader with --set linked_windows=true first")
    if linked_groups is None and model.config.linked_windows:
        logger.warning("%s has linked windows, but single windows train no link and no window selector (each row "
                       "is its own document): give --linked-windows N to train groups of a question's windows",
                       model_path)
    # Built on demand: each document tokenized once, only the drawn windows kept as token ranges (data/windows.py);
    # with cuts the negative draw is the cuts' (data/layout_cuts.py), so every long window is kept here.
    items = QAWindows(tokenizer, rows, window_length, doc_stride, max_windows,
                      1.0 if cut_windows or linked_groups else negative_fraction, settings.seed,
                      token_types=model.config.type_vocab_size >= 2,
                      with_question_tokens=teacher is not None and cut_windows is None,
                      max_question_tokens=question_limit(model, tokenizer, window_length),
                      null_regions=NullRegions.of(model.config, tokenizer))
    if cut_windows is not None:
        items = LayoutCuts(items, cut_windows, model.config.block_size, cut_overlap, negative_fraction,
                           settings.seed)
    collator = None
    if linked_groups is not None:
        items = WindowGroups(items, linked_groups, settings.seed, linked_negatives)
        collator = LinkedBatches(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    distillation = ({} if teacher is None else
                    distillation_teacher(teacher, tokenizer, items, settings, teacher_weight, teacher_temperature,
                                         cuts=cut_windows is not None, start_targets=teacher_targets))
    metrics = train(model, tokenizer, items, out.parent / f".{out.name}.work", settings,
                    checkpoint_dir=out.parent / f"{out.name}.checkpoints", collator=collator,
                    checkpoint_record={"task": "qa", "window_length": window_length, "doc_stride": doc_stride},
                    # what makes the windows: a resume must read them as the run it continues did
                    run_settings={"window_length": window_length, "doc_stride": doc_stride,
                                  "negative_fraction": negative_fraction},
                    **distillation.pop("trainer", {}))

    summary = {"task": "qa", "data": data_record(train_data), "format": data_format, "split": split,
               "source_model": model_record(model_path, preset, max_length),
               "train_examples": len(rows), "windows": items.windows, "training_windows": len(items),
               "window_length": window_length, "doc_stride": doc_stride, "cut_windows": cut_windows,
               "cut_overlap": cut_overlap if cut_windows else None, "linked_groups": linked_groups,
               "linked_negatives": linked_negatives if linked_groups is not None else None,
               "settings": vars(settings), **distillation,
               "processes": world_size(), **training_record(metrics)}
    write_trained_model(out, model, tokenizer, "longbird_finetune.json", summary, overwrite, settings,
                        (model_path, preset, max_length))
    return {**metrics, "windows": items.windows, "training_windows": len(items)}

def distillation_teacher(teacher_path, tokenizer, items: QAWindows | LayoutCuts, settings: FinetuneSettings,
                         weight: float, temperature: float, cuts: bool = False, start_targets: str = "null-relative"
                         ) -> dict:
    """What `finetune_qa` needs to distil from a short reader: {"trainer": train()'s trainer arguments, "teacher": the
    record of the teacher kept in longbird_finetune.json}. On whole long windows the teacher reads them in sliding
    windows (training/sliding_teacher.py); on `cuts` of them it reads each cut in one window of its own
    (training/cut_teacher.py)."""
    from ..training.cut_teacher import CutTeacher, CutTeacherTrainer
    from ..training.sliding_teacher import SlidingTeacher, SlidingTeacherTrainer

    model, teacher_tokenizer = load_on_device(teacher_path, LongBirdForQuestionAnswering)
    if teacher_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ValueError(f"the teacher {teacher_path} reads another vocabulary than the model being trained: the "
                         "teacher must be a QA model fine-tuned from the same source (e.g. `make qa-model`)")
    if cuts:
        teacher = CutTeacher(model, items.long.template, temperature, bf16=settings.bf16,
                             start_targets=start_targets)
        record = {"model": str(teacher_path), "reads": "each cut in one window", "weight": weight,
                  "temperature": temperature, "start_targets": start_targets}
        return {"trainer": {"trainer_class": CutTeacherTrainer,
                            "trainer_kwargs": {"teacher": teacher, "teacher_weight": weight}}, "teacher": record}
    window, stride = trained_windows(teacher_path)
    window = window or model.config.max_position_embeddings
    stride = stride if stride is not None else default_stride(window)
    teacher = SlidingTeacher(model, items.template, window, stride, temperature, token_types=items.token_types)
    record = {"model": str(teacher_path), "window_length": window, "doc_stride": stride, "weight": weight,
              "temperature": temperature}
    return {"trainer": {"trainer_class": SlidingTeacherTrainer,
                        "trainer_kwargs": {"teacher": teacher, "teacher_weight": weight}}, "teacher": record}

def evaluate_qa(model_path, data, *, data_format: str = "korquad2", window_length: int | None = None,
                doc_stride: int | None = None, max_windows: int | None = None, batch_size: int = 4,
                max_examples: int | None = None, out: str | Path | None = None, progress: bool = False,
                split: str | None = None, device: str | None = None, overwrite: bool = False,
                max_answer_tokens: int | None = None, scoring: str = DEFAULT_SCORING, compile: bool = False,
                bf16: bool = False, lexical_weight: float = DEFAULT_WEIGHT,
                lexical_radius: int = DEFAULT_RADIUS) -> dict:
    """Predict every question and score with the official metric of the format. With `out`, writes
    predictions.json ({id: text}) and metrics.json (scores, number of questions, model, data) there atomically.
    `max_answer_tokens` defaults to the model's `qa_max_answer_tokens`; `scoring` ranks spans across windows
    (`qa.SCORING_RULES`); `compile`: the encoder compiled with torch.compile (compilation.py); `bf16`: read under
    bf16 autocast with the encoder's Linear weights stored in bf16 (`precision.store_encoder_linears_in`);
    `lexical_weight` (0: off) and `lexical_radius`: the lexical prior across places (lexical_prior.py)."""
    if batch_size < 1:  # checked before the data and the model are read (it named --max-windows at the first batch)
        raise ValueError(f"--batch-size must be at least 1 (windows per forward); got {batch_size}")
    check_output(out, overwrite, reads=(model_path,))
    rows, skipped = (data, 0) if isinstance(data, Dataset) else read_qa_data(data, data_format, split)
    rows = sample_questions(rows, max_examples)
    model, tokenizer = load_on_device(model_path, LongBirdForQuestionAnswering, device, compile=compile, bf16=bf16)
    check_tokenizer(model, tokenizer)
    window_length, doc_stride, window_source = reading_windows(model, model_path, window_length, doc_stride)
    with bf16_autocast(model.device.type, bf16):
        answers = predict_rows(model, tokenizer, rows, window_length, doc_stride, max_windows, batch_size,
                               max_answer_tokens=max_answer_tokens, scoring=scoring, progress=progress,
                               max_question_tokens=question_limit(model, tokenizer, window_length),
                               lexical_weight=lexical_weight, lexical_radius=lexical_radius)
    predictions = {row["id"]: answers[row["id"]].text if row["id"] in answers else "" for row in rows}
    metrics = score_predictions(predictions, rows, data_format)
    if skipped:  # as the official scripts do, a question we could not read scores 0
        kept = len(rows) / (len(rows) + skipped)
        metrics = {"exact_match": metrics["exact_match"] * kept, "f1": metrics["f1"] * kept,
                   "skipped_questions": skipped}
    if out is not None:
        record = {**metrics, "questions": len(rows), "model": str(model_path), "data": describe_data(data),
                  "format": data_format, "split": split, "window_length": window_length,
                  "window_source": window_source, "doc_stride": doc_stride, "max_windows": max_windows,
                  "scoring": scoring, "lexical_weight": lexical_weight, "lexical_radius": lexical_radius,
                  "max_answer_tokens": max_answer_tokens or model.config.qa_max_answer_tokens}
        write_outputs(out, overwrite, predictions, record)
    return {"metrics": metrics, "predictions": predictions, "answers": answers}

def score_predictions(predictions: dict[str, str], rows, data_format: str) -> dict[str, float]:
    """Official metric for the format, computed on the same questions the predictions cover."""
    if data_format == "korquad2":
        dataset = [{"qas": [{"id": row["id"], "answer": {"text": row["answers"]["text"][0]}}]} for row in rows]
        return korquad_v2(predictions, dataset)
    dataset = [{"paragraphs": [{"qas": [{"id": row["id"], "answers": [{"text": t} for t in row["answers"]["text"]]}]}]}
               for row in rows]
    return (squad_v1 if data_format == "squad" else korquad_v1)(predictions, dataset)

def per_question_scores(predictions: dict[str, str], rows, data_format: str) -> dict[str, dict[str, float]]:
    """{id: {"exact_match", "f1"}} (0-100) with the official metric of the format, one question at a time: what
    bootstrap intervals resample. Their mean over `rows` equals `score_predictions`."""
    return {row["id"]: score_predictions({row["id"]: predictions.get(row["id"], "")}, [row], data_format)
            for row in rows}

def check_min_probability(min_probability: float) -> None:
    """`answer`'s threshold is a probability; checked on every call, before a model directory is loaded."""
    if not 0.0 <= min_probability <= 1.0:
        raise ValueError(f"--min-probability must lie in [0, 1]; got {min_probability}")

def answer(model, *, document: str, question: str, tokenizer=None, is_html: bool | None = None,
           window_length: int | None = None, device: str | None = None, max_answer_tokens: int | None = None,
           scoring: str = DEFAULT_SCORING, doc_stride: int | None = None, model_dir=None,
           min_probability: float = 0.0, max_question_tokens: int | None = None, compile: bool = False,
           lexical_weight: float = DEFAULT_WEIGHT, lexical_radius: int = DEFAULT_RADIUS) -> dict:
    """Answer `question` about `document` (a long text or HTML page, as a string) with a fine-tuned longbird QA model:
    a directory path, or a loaded model with its `tokenizer` (and `model_dir`, where its record lives). Returns
    `qa.answer_record`: the readable answer, the raw span, character offsets into `document`, score and probability
    (all None when no span qualifies), plus `window_length` and `window_source`: unless given, windows are the length
    the model was fine-tuned at (`reader.trained_windows`), else its full length. With `min_probability` > 0 a best
    span whose probability is below it is no answer (all fields None; `best_probability` says how close it came), so
    a caller can tell "not in this document" from a guess. The engine is `longbird.Reader` (one call of it), which
    `longbird serve` shares; transformers 5 has no question-answering pipeline. `document` and `question` are
    keywords: two strings in the wrong order would read the question as the document."""
    from ..qa import answer_record

    check_question(question)
    check_min_probability(min_probability)
    if isinstance(model, (str, Path)):
        reader = Reader(model, device, scoring=scoring, compile=compile, lexical_weight=lexical_weight,
                        lexical_radius=lexical_radius)
    elif tokenizer is None:
        raise ValueError("a loaded model needs its tokenizer: answer(model, document=..., question=..., "
                         "tokenizer=...)")
    else:
        reader = Reader.of(model, tokenizer, model_dir, scoring=scoring, lexical_weight=lexical_weight,
                           lexical_radius=lexical_radius)
    if is_html is None:
        is_html = looks_like_html(document)
    reading = reader.answer(question, document, is_html=is_html, max_answer_tokens=max_answer_tokens,
                            window_length=window_length, doc_stride=doc_stride,
                            max_question_tokens=max_question_tokens)
    found = reading.answers[0] if reading.answers else answer_record(None, is_html)
    windows = {"window_length": reading.window_length, "window_source": reading.window_source}
    if reading.question_cut:  # windows read only its start: say so rather than answer in silence
        windows["question_cut"] = reading.question_cut
    if min_probability > 0 and found["answer"] is not None:
        if found["probability"] is None:
            raise ValueError("--min-probability needs the conditional-end head's probability; this model has the "
                             "linear head (qa_head='linear'): leave --min-probability out")
        if found["probability"] < min_probability:
            return answer_record(None, is_html) | windows | {"best_probability": found["probability"]}
    return found | windows
