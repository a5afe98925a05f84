"""The whole article in one pass with its paragraphs as the attention's blocks (E7 round 20, zero-shot probe).

Rounds 10 and 19 located what the long layout costs: the source's absolute positions stop at 512, so a token read
past them sits among positions the paragraph reader never saw together (round 10: 6 F1 near the answer before any
training), and sliding windows that cut a paragraph cost 2.1 F1 against windows that start at it (round 19). This
probe reads every dev-side article in **one sequence** laid out by its paragraphs:

    [CLS] question [SEP] [SEP] | null_1 p_1 [SEP] | null_2 p_2 [SEP] | ...

Each paragraph (a paragraph longer than a window in the windows its own tokens would get) is a *segment*: its
tokens take the positions they take in the paragraph reader's window (`[CLS]` 0, the question, then the paragraph
from the first document position on), its null is a copy of `[CLS]` at position 0, and it attends to the question
and to itself only. So no token ever sees a position pair the source did not, and no paragraph is cut. The spans of
all segments are ranked in one pass, null-relative to their own segment's null (the regional nulls of round 4),
without and with the library's lexical prior.

Variants (`--variants`), how the question is read:
- `replicated`: every segment carries its own copy of `[CLS] question [SEP] [SEP]` (no shared part): the paragraph
  reader on each paragraph, batched as one sequence; the reference the shared variants are measured against.
- `question-alone`: one shared question, whose queries read the question only.
- `question-global`: one shared question, whose queries read the whole article (BigBird ITC's global tokens).

`--carry` (round 23): a paragraph that fits a window is read in the window that starts at it and goes on over the
article's following text (what a sliding window starting at the paragraph reads), the following text as context only:
no offsets, so never a candidate. Round 22's equal-budget loss lay mostly in the article's first 512 tokens, which the
sliding reader's first window reads whole with the paragraphs beside each other; a carried segment reads its
paragraph with what follows it as that window does, and still no paragraph is cut.

Attention runs through SDPA per segment (`SegmentPlan`: a segment's queries over the question's keys and its own),
so a question costs about what its article's windows cost; `attention_mask` is the same rule as a dense mask (the
tests' reference).
Without `--sliding`/`--layout` the reader is read in sliding 512-token windows (stride 128, the baseline) and in each
`--variants` layout; `--sliding NAME=DIR` and `--layout NAME=DIR:VARIANT` read trained rows instead
(`e7_paragraph_training.py`), `--resume` keeping the readings already in the results file.

Usage: python experiments/e7_paragraph_layout.py --reader qa-model/kobigbird-e5-korquad [--variants ...]
       python experiments/e7_paragraph_layout.py --reader qa-model/kobigbird-e5-korquad --resume \
           --sliding sliding-512-trained=DIR --layout global-trained=DIR:question-global
       python experiments/e7_paragraph_layout.py --reader qa-model/kobigbird-e5-korquad --report \
           --baseline sliding sliding-512-trained   # pair with both: the second in a section of its own
Writes experiments/results/NAME.{json,md,png}; `--baseline A B ...` pairs every reading with A in the tables and with
each further baseline in a section of its own ("Against `B`"; its differences under `f1_vs` in the JSON), so one
results file serves several baselines.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "experiments"))

from e4_korquad_articles import BUCKETS, answer_buckets  # noqa: E402
from e7_all_dev import cross_fitted, halves  # noqa: E402
from e7_diagnosis import trained_apart  # noqa: E402
from e7_long_reading import add_output_arguments, held_out_record, machine, provenance, wants_bf16, write_tables  # noqa: E402
from e7_paragraph_cuts import DATA, article_paragraphs  # noqa: E402
from e7_paragraph_windows import cell  # noqa: E402
from lexical_prior import RADII, WEIGHTS, mean_f1, read_windows, scores_by_setting, scores_with  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from longbird import layers  # noqa: E402
from longbird.checkpoints import load_task_model  # noqa: E402
from longbird.data.features import QAFeature, label_window, make_features, plain_document  # noqa: E402
from longbird.data.korquad import read_korquad_v1_articles, split_by_title  # noqa: E402
from longbird.heads import LongBirdForQuestionAnswering  # noqa: E402
from longbird.lexical_prior import DEFAULT_RADIUS, DEFAULT_WEIGHT, LexicalPrior  # noqa: E402
from longbird.metrics.intervals import bucket_summary, paired_by_bucket  # noqa: E402
from longbird.precision import bf16_autocast, store_encoder_linears_in  # noqa: E402
from longbird.qa import decode_outputs, run_windows  # noqa: E402
from longbird.tasks.qa import question_limit  # noqa: E402

VARIANTS = ("replicated", "question-alone", "question-global")
SHARED = -1  # the group of the shared question
# What the lead prior adds to a span that starts in the article's first paragraph, in the units of a span's score
# (start logit + log P(end | start), null-relative): cross-fitted with the lexical prior's radius:weight (`--lead`).
LEAD_BONUSES = (0.0, 0.5, 1.0, 2.0, 4.0)


@dataclasses.dataclass
class LeadPrior:
    """The lexical prior (or none) plus `bonus` for a span starting in the article's first paragraph (round 24).

    Round 24 found the whole first-512 loss of the paragraph layout in the article's first paragraph, where a carried
    segment and the sliding reader's first window are the same tokens: so a ranking loss, not a reading one. The
    sliding reader's first window is the only window that starts where a paragraph starts, the kind of window the
    paragraph reader was trained on, and it wins ties for the opening; in the layout every segment starts at its
    paragraph, and the opening competes on equal terms. This prior states the opening's advantage explicitly, for every
    reader alike, so that its weight is chosen per reader by cross-fitting rather than by the window layout.
    Duck-types `LexicalPrior` for `rank_answers` (`weight`, `for_question`)."""

    lexical: LexicalPrior | None
    bonus: float
    lead_end: dict[str, int]  # question id -> the character where its article's first paragraph ends

    @property
    def weight(self) -> float:  # rank_answers skips a prior whose weight is 0
        return self.bonus + (self.lexical.weight if self.lexical else 0.0)

    def for_question(self, features):
        lexical = self.lexical.for_question(features) if self.lexical else None
        end = self.lead_end[features[0].example_id]

        def prior(feature, start: int) -> float:
            lead = self.bonus if feature.offsets[start][0] < end else 0.0
            return lead + (lexical(feature, start) if lexical else 0.0)

        return prior


def scores_with_lead(windows, documents, rows, special_ids: frozenset[int],
                     lead_end: dict[str, int]) -> dict[str, dict[str, dict]]:
    """Per-question scores under every lexical setting of the grid (`none` and radius:weight) with every lead bonus,
    keyed "SETTING+BONUS": what `--lead` cross-fits over."""
    settings = ["none"] + [f"{r}:{w}" for w in sorted(WEIGHTS) if w != 0 for r in RADII]
    out = {}
    for key in settings:
        lexical = None if key == "none" else LexicalPrior(float(key.split(":")[1]), int(key.split(":")[0]),
                                                          special_ids)
        for bonus in LEAD_BONUSES:
            out[f"{key}+{bonus:g}"] = scores_with(windows, documents, rows,
                                                  LeadPrior(lexical, bonus, lead_end) if bonus else lexical)
    return out


@dataclasses.dataclass
class Layout:
    feature: QAFeature  # input ids, offsets into the whole article, position ids, region nulls
    groups: list[int]  # per token: its segment, or SHARED for the shared question
    carried: list[bool]  # per token: read as the following paragraphs' context, never an answer (`carry`)


def paragraph_layout(tokenizer, question_id: str, question: str, article: str, paragraphs: list[tuple[int, int]],
                     variant: str, window: int, stride: int, max_question_tokens: int,
                     answer: tuple[int, int] | None = None, carry: bool = False) -> Layout:
    """One sequence for a question over its whole article (module docstring). `answer`: the gold (start, end)
    characters in the article; the first segment that holds all of it is labelled (`feature.start_position` and
    `end_position`, 0 when none does). `carry`: a paragraph that fits one window is read in the window that starts at
    it and goes on over the article's following text, as a sliding window starting there would (round 23); the
    following text is context only (`Layout.carried`: no offsets, never a candidate nor a label)."""
    ids, offsets, positions, nulls, groups, carried = [], [], [], [], [], []
    label, segment = (0, 0), -1
    for low, high in paragraphs:
        pieces = make_features(tokenizer, question_id, question, plain_document(article[low:high]), window, stride,
                               max_question_tokens=max_question_tokens)
        if carry and len(pieces) == 1:
            # 4 characters a token more than fill any window (Korean and English run at 1.5-4): the text cut here
            # is never read, the window is truncated first.
            following = plain_document(article[low:high + 4 * window])
            pieces = make_features(tokenizer, question_id, question, following, window, max_windows=1,
                                   max_question_tokens=max_question_tokens)
        for piece in pieces:
            first = next(i for i, o in enumerate(piece.offsets) if o is not None)  # first document token
            segment += 1
            follows = [o is not None and o[0] >= high - low for o in piece.offsets]  # past the paragraph's end
            shifted = [None if o is None or after else (o[0] + low, o[1] + low)
                       for o, after in zip(piece.offsets, follows)]
            if variant == "replicated":
                null = len(ids)
                keep = range(len(piece.input_ids))
            else:
                if not ids:  # the shared question: [CLS] question [SEP] [SEP], its own null is the [CLS]
                    ids += piece.input_ids[:first]
                    offsets += [None] * first
                    positions += list(range(first))
                    nulls += [0] * first
                    groups += [SHARED] * first
                    carried += [False] * first
                null = len(ids)
                ids.append(piece.input_ids[0])  # the segment's null: a copy of [CLS] at position 0
                offsets.append(None)
                positions.append(0)
                nulls.append(null)
                groups.append(segment)
                carried.append(False)
                keep = range(first, len(piece.input_ids))
            if answer is not None and label == (0, 0):
                start, end = label_window(shifted, answer)
                if start:  # index in the layout: the kept tokens follow the null (or the copy's own start)
                    moved = len(ids) - keep.start
                    label = (start + moved, end + moved)
            for i in keep:
                ids.append(piece.input_ids[i])
                offsets.append(shifted[i])
                positions.append(i)
                nulls.append(null)
                groups.append(segment)
                carried.append(follows[i])
    feature = QAFeature(question_id, ids, None, offsets, *label, position_ids=positions, region_nulls=nulls)
    return Layout(feature, groups, carried)


def attention_mask(groups: list[int], variant: str) -> torch.Tensor:
    """(1, 1, l, l) bool, True where query i reads key j: its own segment and the shared question; the shared
    question's queries read the question only, or everything (`question-global`)."""
    g = torch.tensor(groups)
    shared = g == SHARED
    mask = (g[:, None] == g[None, :]) | shared[None, :]
    if variant == "question-global":
        mask |= shared[:, None]
    return mask[None, None]


@dataclasses.dataclass
class SegmentPlan:
    """The layout's attention as index tables, so that it costs what its segments cost rather than l²: each segment's
    queries over the shared question's keys and its own (one padded row per segment), the shared question's queries
    over the question or over every token."""

    shared: torch.Tensor  # (Q,) the shared question's tokens
    members: torch.Tensor  # (S, M) each segment's tokens, padded with 0
    real: torch.Tensor  # (S, M) bool, False on that padding
    question_global: bool

    @classmethod
    def of(cls, groups: list[int], variant: str) -> SegmentPlan:
        g = torch.tensor(groups)
        segments = [torch.nonzero(g == s).flatten() for s in sorted(set(groups) - {SHARED})]
        width = max(len(m) for m in segments)
        members = torch.zeros(len(segments), width, dtype=torch.long)
        real = torch.zeros(len(segments), width, dtype=torch.bool)
        for row, m in enumerate(segments):
            members[row, :len(m)], real[row, :len(m)] = m, True
        return cls(torch.nonzero(g == SHARED).flatten(), members, real, variant == "question-global")

    def attend(self, query, key, value):
        """(1, H, l, d) each -> (1, H, l, d): what SDPA under `attention_mask(groups, variant)` computes."""
        heads, length, width = query.shape[1], query.shape[2], value.shape[-1]
        q, k, v = query[0], key[0], value[0]  # (H, l, d)
        out = q.new_empty(heads, length, width)
        segments, members = self.members.shape
        flat = self.members.flatten()

        def rows(x):  # (H, l, d) -> (S, H, M, d)
            return x[:, flat].view(heads, segments, members, -1).transpose(0, 1)

        shared_keys, shared_values = k[:, self.shared], v[:, self.shared]
        keys = torch.cat([shared_keys.expand(segments, -1, -1, -1), rows(k)], dim=2)
        values = torch.cat([shared_values.expand(segments, -1, -1, -1), rows(v)], dim=2)
        reads = torch.cat([torch.ones(segments, len(self.shared), dtype=torch.bool), self.real], dim=1)
        context = F.scaled_dot_product_attention(rows(q), keys, values, attn_mask=reads[:, None, None, :])
        kept = self.real.flatten()
        out[:, flat[kept]] = context.transpose(0, 1).reshape(heads, segments * members, width)[:, kept]
        if len(self.shared):
            over = (k, v) if self.question_global else (shared_keys, shared_values)
            out[:, self.shared] = F.scaled_dot_product_attention(q[:, self.shared][None], over[0][None],
                                                                 over[1][None])[0]
        return out[None]


@contextlib.contextmanager
def masked(model, plan: SegmentPlan):
    """Inside: every layer of `model` attends as `plan` says (full attention for every row, the plan deciding what
    reads what; the sequence may be longer than the model's table of positions, since its positions stay below the
    source's 512)."""

    def attend(self, query, key, value, *rest):
        return plan.attend(query, key, value)

    config = model.config
    saved = config.full_attention_max_length, config.max_position_embeddings
    config.full_attention_max_length = config.max_position_embeddings = 10 ** 9
    try:
        with mock.patch.object(layers.LongBirdSelfAttention, "_attend", attend):
            yield
    finally:
        config.full_attention_max_length, config.max_position_embeddings = saved


def read_layouts(model, tokenizer, rows, paragraphs, variant: str, window: int, stride: int, bf16: bool,
                 carry: bool = False):
    """Every question's one-sequence reading: its decoded candidates (`carry`: as `paragraph_layout`)."""
    cap = question_limit(model, tokenizer, window)
    top_k = model.config.qa_top_k
    windows = []
    for row in tqdm(rows, desc=variant, unit="question"):
        layout = paragraph_layout(tokenizer, row["id"], row["question"], row["context"], paragraphs[row["title"]],
                                  variant, window, stride, cap, carry=carry)
        with masked(model, SegmentPlan.of(layout.groups, variant)), bf16_autocast("cpu", bf16):
            outputs = run_windows(model, [layout.feature], top_k)[0]
        windows.append(decode_outputs(model, layout.feature, outputs, top_k))
    return windows


def training_record(directory: Path) -> dict:
    """What a row's model was trained with (budget, updates, questions, tokens): the record e7_paragraph_training.py
    writes, or the summary of `longbird finetune-qa` (the sliding baselines, and the paragraph reader itself: its CPU
    budget if it had one, its updates, tokens and what it started from); {} for a model without such a record.
    (The committed rows of rounds 21-31 predate the second: their baselines' budgets are in docs/experiments/e7.md.)"""
    path = directory / "longbird_finetune.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    metrics = record.get("metrics") or {}
    budget = metrics.get("cpu_budget") or {}
    steps = [entry["step"] for entry in record.get("log_history") or [] if "step" in entry]
    finetune_qa = {"cpu_budget_minutes": budget.get("minutes"), "cpu_seconds": budget.get("cpu_seconds"),
                   "updates": budget.get("steps", max(steps, default=None)),  # --max-steps runs: their last step
                   "tokens_seen": metrics.get("tokens_seen"),
                   # what that training started from: the paragraph reader's own record starts from the bare source
                   "started_from": (record.get("source_model") or {}).get("model")}
    return {key: record.get(key, finetune_qa.get(key)) for key in (
        "cpu_budget_minutes", "cpu_seconds", "updates", "questions", "tokens_seen", "layout", "started_from")
        if record.get(key, finetune_qa.get(key)) is not None}


def reading_specs(args) -> dict[str, tuple[Path, str]]:
    """{name: (model directory, "sliding" or a layout variant)}: `--sliding NAME=DIR` and `--layout
    NAME=DIR:VARIANT`, or without either the reader in sliding windows ("sliding") and in every `--variants` layout."""
    specs = {}
    for spec in args.sliding:
        name, _, directory = spec.partition("=")
        specs[name] = (Path(directory), "sliding")
    for spec in args.layout:
        name, _, rest = spec.partition("=")
        directory, _, variant = rest.rpartition(":")
        if variant not in VARIANTS:
            raise SystemExit(f"--layout {spec}: the variant must be one of {', '.join(VARIANTS)}")
        specs[name] = (Path(directory), variant)
    if not specs:
        suffix = "-carry" if args.carry else ""
        specs = {"sliding": (args.reader, "sliding"), **{v + suffix: (args.reader, v) for v in args.variants}}
    return specs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reader", type=Path, required=True, help="The paragraph reader (make qa-model)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--sliding", action="append", default=[], help="NAME=DIR: a model read in sliding windows")
    parser.add_argument("--layout", action="append", default=[], help="NAME=DIR:VARIANT: a model read in layouts")
    parser.add_argument("--carry", action="store_true",
                        help="Every layout's paragraph that fits a window reads on over the article's following text "
                             "as context (paragraph_layout's carry; round 23); the untrained readings are named "
                             "VARIANT-carry")
    parser.add_argument("--baseline", nargs="+", default=None, metavar="READING",
                        help="The readings every other is paired with (default: sliding): the first in every table, "
                             "each further one in a section of its own after them, from the same results file (no "
                             "copy of it per baseline)")
    parser.add_argument("--resume", action="store_true", help="Keep the readings of the results file NAME.json")
    parser.add_argument("--max-articles", type=int, default=None, help="Only the first N dev-side articles")
    parser.add_argument("--cross-fit", action="store_true",
                        help="Also a `cross-fitted` reading: the articles in two seeded halves (e7_all_dev.halves, "
                             "seed 0), each half read with the prior's radius:weight that scored best on the other "
                             "half, so that every reader gets a prior tuned to it and no question chooses its own")
    parser.add_argument("--lead", action="store_true",
                        help="Also a `lead` reading: the lexical prior and the lead prior (LeadPrior: a bonus for "
                             "spans in the article's first paragraph) cross-fitted together over the halves, as "
                             "--cross-fit does for the lexical prior alone (round 24)")
    parser.add_argument("--keep-candidates", type=Path, default=None,
                        help="Save every reading's decoded candidates and documents to DIR/NAME.pt (torch.save), so "
                             "that a new scoring rule can be tried without reading again")
    parser.add_argument("--report", action="store_true",
                        help="Read nothing: rewrite the tables of the results file NAME.json (implies --resume)")
    add_output_arguments(parser, "e7_paragraph_layout")
    args = parser.parse_args()
    bf16 = wants_bf16(args.precision)
    window, stride = 512, 128
    rows, _ = read_korquad_v1_articles(DATA)
    split = split_by_title(rows)
    dev = list(split["dev"])
    titles = sorted({row["title"] for row in dev})[:args.max_articles]
    dev = [row for row in dev if row["title"] in titles]
    paragraphs = {title: [span for span, _ in spans] for title, spans in article_paragraphs(DATA).items()
                  if title in titles}
    article_of = {row["id"]: row["title"] for row in dev}
    paragraph_of = {i: index for title, spans in article_paragraphs(DATA).items() if title in titles
                    for index, (_, ids) in enumerate(spans) for i in ids}
    lead_end = {row["id"]: paragraphs[row["title"]][0][1] for row in dev}
    half_of_title = halves(titles, 0)
    half_of = {i: half_of_title[title] for i, title in article_of.items()}
    path = args.out / f"{args.name}.json"
    first_baseline, *other_baselines = args.baseline or ["sliding"]
    if args.report and not path.exists():
        raise SystemExit(f"--report rewrites {path}, which does not exist: run the readings first")
    earlier = json.loads(path.read_text()) if (args.resume or args.report) and path.exists() else {"readings": {}}
    if earlier["readings"] and earlier["questions"] != len(dev):
        raise SystemExit(f"{path} read {earlier['questions']} questions, this run {len(dev)}: not resumable")
    scores = {name: {r: part["per_question"] for r, part in by_prior.items()}
              for name, by_prior in earlier["readings"].items()}
    specs = {} if args.report else reading_specs(args)
    missing = [b for b in (args.baseline or []) if b not in scores and b not in specs]
    if missing:  # before any reading: a typo should not cost one
        raise SystemExit(f"--baseline {' '.join(missing)}: no such reading in {path} or in this run (readings: "
                         f"{', '.join([*scores, *specs]) or 'none'}); read it first (--sliding or --layout) or name "
                         "one of these")
    cpu, lengths = earlier.get("cpu_seconds", {}), earlier.get("sequence_tokens", {})
    models = earlier.get("models", {})
    tokenizer = load_task_model(args.reader, LongBirdForQuestionAnswering)[1] if args.report else None
    for name, (directory, how) in specs.items():
        model, tokenizer = load_task_model(directory, LongBirdForQuestionAnswering)
        trained_apart(directory, set(titles))
        if bf16:
            store_encoder_linears_in(model)
        prior = LexicalPrior(DEFAULT_WEIGHT, DEFAULT_RADIUS, frozenset(tokenizer.all_special_ids))
        started = time.process_time()
        if how == "sliding":
            windows, documents = read_windows(model, tokenizer, dev, window, stride, bf16)
        else:
            windows = read_layouts(model, tokenizer, dev, paragraphs, how, window, stride, bf16, args.carry)
            documents = {row["id"]: plain_document(row["context"]) for row in dev}
            x = sorted(len(w.feature.input_ids) for w in windows)
            lengths[name] = {"median": x[len(x) // 2], "max": x[-1]}
        cpu[name] = time.process_time() - started
        scores[name] = {"none": scores_with(windows, documents, dev, None),
                        "default": scores_with(windows, documents, dev, prior)}
        models[name] = {"model": directory.as_posix(), "reading": how, "training": training_record(directory),
                        **({"carry": True} if args.carry and how != "sliding" else {})}
        if args.keep_candidates:
            keep = args.keep_candidates / f"{name}.pt"
            keep.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"windows": windows, "documents": documents}, keep.with_suffix(".tmp"))
            keep.with_suffix(".tmp").replace(keep)  # whole or not at all
        if args.lead:
            by_setting = scores_with_lead(windows, documents, dev, frozenset(tokenizer.all_special_ids), lead_end)
            scores[name]["lead"], chosen = cross_fitted(by_setting, half_of)
            models[name]["lead"] = {"chosen_by_half": chosen,
                                    "mean_f1_by_setting": {k: mean_f1(v) for k, v in by_setting.items()}}
        if args.cross_fit:
            special = frozenset(tokenizer.all_special_ids)
            by_setting = scores_by_setting(windows, documents, dev, special)
            scores[name]["cross-fitted"], chosen = cross_fitted(by_setting, half_of)
            models[name]["cross_fitted"] = {"chosen_by_half": chosen,
                                            "mean_f1_by_setting": {k: mean_f1(v) for k, v in by_setting.items()}}
        print(name, {r: round(mean_f1(s), 2) for r, s in scores[name].items()}, flush=True)
    buckets = answer_buckets(dev, tokenizer)  # every reading's tokenizer is the reader's (trained from it)
    contexts = {row["title"]: row["context"] for row in dev}
    article_tokens = {t: len(tokenizer(c, add_special_tokens=False)["input_ids"]) for t, c in sorted(contexts.items())}
    baseline = scores.get(first_baseline)
    results = {"command": "python " + shlex.join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "machine": machine(),
               "bf16": bf16, "reader": args.reader.as_posix(),
               "held_out": held_out_record(split["train"], split["dev"]), "questions": len(dev),
               "articles": len(titles), "window": window, "stride": stride,
               "bucket_sizes": {b: list(buckets.values()).count(b) for b in BUCKETS}, "cpu_seconds": cpu,
               "sequence_tokens": lengths, "models": models, "baseline": first_baseline,
               "other_baselines": other_baselines,
               "article_tokens": article_tokens, "article_of": article_of, "paragraph_of": paragraph_of,
               "halves": half_of_title,
               "readings": {}}
    if args.report:  # nothing read: the provenance stays the readings'
        results.update({k: earlier[k] for k in ("command", "machine", "earlier_commands") if k in earlier})
    elif earlier["readings"]:
        results["earlier_commands"] = earlier.get("earlier_commands", []) + [earlier["command"]]
    for name, by_prior in scores.items():
        results["readings"][name] = {
            reading: {**bucket_summary(s, buckets, BUCKETS, None if baseline is None or name == first_baseline
                                       else baseline.get(reading), article_of), "per_question": s}
            for reading, s in by_prior.items()}
        for other in other_baselines:
            if other != name:
                pair_with(results["readings"][name], other, scores[other], buckets, article_of)
    lines = table(results) + [""] + by_article_length(results) + [""] + by_answer_paragraph(results)
    for other in other_baselines:
        lines += [""] + against(results, other)
    write_tables(args.out, args.name, results, lines)
    plot_budget(results, args.out / f"{args.name}.png")


def pair_with(summaries: dict, other: str, other_scores: dict, buckets: dict, article_of: dict) -> None:
    """Add to one reading's summaries (prior -> bucket -> summary) its paired F1 difference from a further baseline
    `other` with the same prior, per answer bucket, under `f1_vs[other]`: what the first baseline's `f1_vs_baseline`
    is, computed the same way (`paired_by_bucket`), for the further baselines of `--baseline`."""
    for prior, summary in summaries.items():
        if prior not in other_scores:
            continue
        paired = paired_by_bucket(summary["per_question"], buckets, BUCKETS, other_scores[prior], article_of)
        for bucket, difference in paired.items():
            summary[bucket].setdefault("f1_vs", {})[other] = difference


def against(results: dict, other: str) -> list[str]:
    """The section of a further baseline: every reading's paired difference from `other` with the same prior
    (overall, first 512 and beyond), then the article-length and answer-paragraph tables against it."""
    lines = [f"### Against `{other}`", "",
             f"The same readings paired with `{other}` (the same prior, the same questions; intervals resample "
             "articles):", "",
             "| reading | prior | F1 | − baseline (95 % CI) | first 512 / beyond 512 |",
             "|---|---|---:|---:|---:|"]
    for name, by_prior in results["readings"].items():
        for reading, summary in by_prior.items():
            paired = summary["all"].get("f1_vs", {}).get(other)
            lines.append(
                f"| {name} | {reading} | {summary['all']['f1']:.1f} | "
                + (f"{paired['difference']:+.1f} ({paired['low']:+.1f} to {paired['high']:+.1f}) | "
                   + " / ".join(f"{summary[b]['f1_vs'][other]['difference']:+.1f}" for b in BUCKETS if b in summary)
                   if paired else "(the baseline) | " if name == other
                   else f"(`{other}` has no `{reading}` reading) | ")
                + " |")
    return lines + [""] + by_article_length(results, other) + [""] + by_answer_paragraph(results, other)


def budget_curves(results: dict, prior: str) -> dict[str, list[tuple[float, float]]]:
    """{series: [(training CPU minutes, F1)]} of the trained layout rows, one series per variant, segment count,
    choice of distractors and carry, each starting from the same variant read untrained (0 minutes), with carry or
    without as it was trained, when that reading is in the results. A row trained from another model than the
    results' paragraph reader (round 27: the layout after sliding-512 training) is left off: its CPU minutes are only
    its last phase's, so on this axis it would stand at a budget it did not have (the tables give it)."""
    reader = results.get("reader")
    untrained, curves, starts = {}, {}, {}
    for name, model in results.get("models", {}).items():
        f1 = results["readings"][name][prior]["all"]["f1"]
        training = model.get("training", {})
        if model["reading"] == "sliding":
            continue
        if "layout" not in training:
            if not reader or Path(model["model"]) == Path(reader):  # another model read untrained starts no curve
                untrained[(model["reading"], bool(model.get("carry")))] = f1
            continue
        if reader and training.get("started_from") and Path(training["started_from"]) != Path(reader):
            continue
        layout = training["layout"]
        series = f"{layout['variant']}, {layout['segments'] or 'all'} segments" + (
            " (BM25 distractors)" if layout.get("distractors") == "bm25" else "") + (
            ", carrying the following text" if layout.get("carry") else "")
        starts[series] = (layout["variant"], bool(layout.get("carry")))
        curves.setdefault(series, []).append((training["cpu_budget_minutes"], f1))
    for series, points in curves.items():
        start = starts[series]
        curves[series] = ([(0.0, untrained[start])] if start in untrained else []) + sorted(points)
    return curves


def plot_budget(results: dict, path: Path) -> None:
    """F1 against training CPU minutes for the trained layouts, with and without the prior, and the baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from longbird.files import save_figure_atomically

    curves = {prior: budget_curves(results, prior) for prior in ("none", "default")}
    if not any(curves.values()):
        return
    figure, axis = plt.subplots(figsize=(11, 4.6))
    baselines = [b for b in [results["baseline"], *results.get("other_baselines", [])] if b in results["readings"]]
    colours = {series: f"C{i}" for i, series in enumerate(curves["default"])}
    for prior, style, words in (("default", "-", "with the prior"), ("none", ":", "no prior")):
        for series, points in curves[prior].items():
            axis.plot(*zip(*points), style, marker="o", color=colours[series], label=f"{series}, {words}")
        for shade, name in zip(("grey", "black", "silver"), baselines):
            axis.axhline(results["readings"][name][prior]["all"]["f1"], color=shade, linestyle=style, linewidth=1,
                         label=f"{name}, {words}")
    axis.set_xlabel("training CPU minutes")
    axis.set_ylabel(f"F1, {results['questions']} dev-side questions")
    axis.set_title("E7: the paragraph layout trained for more CPU minutes")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: the curves stay visible
    figure.tight_layout()
    save_figure_atomically(figure, path)
    plt.close(figure)


# Article lengths in tokens of the reader's tokenizer: up to two windows, up to four, up to eight, longer.
LENGTH_BUCKETS = ((0, 1024), (1024, 2048), (2048, 4096), (4096, None))


def length_bucket(tokens: int) -> str:
    low, high = next((low, high) for low, high in LENGTH_BUCKETS if high is None or tokens <= high)
    return f"> {low:,}" if high is None else f"{low + 1:,}–{high:,}"


def by_article_length(results: dict, baseline: str | None = None) -> list[str]:
    """Mean F1 per article-length bucket for every reading with the default prior, and each reading's difference
    from the baseline (the results' first unless named) over the same questions: where in article length a reading
    wins or loses."""
    baseline = baseline or results["baseline"]
    lengths, article_of = results["article_tokens"], results["article_of"]
    bucket_of = {q: length_bucket(lengths[title]) for q, title in article_of.items()}
    names = [b for b in (length_bucket(low + 1) for low, _ in LENGTH_BUCKETS) if b in set(bucket_of.values())]
    lines = ["F1 by the article's length in tokens (the default prior; in brackets the difference from "
             f"`{baseline}` on the same questions; articles and questions per bucket in the header):", "",
             "| reading | " + " | ".join(
                 f"{b} ({len({article_of[q] for q in bucket_of if bucket_of[q] == b})} / "
                 f"{sum(v == b for v in bucket_of.values())})" for b in names) + " |",
             "|---|" + "---:|" * len(names)]
    return lines + bucket_rows(results, bucket_of, names, baseline)


def bucket_rows(results: dict, bucket_of: dict, names, baseline_name: str) -> list[str]:
    """One table row per reading (default prior): its mean F1 in each bucket of questions, with the difference from
    the baseline's on the same questions."""
    baseline = results["readings"].get(baseline_name, {}).get("default", {}).get("per_question")
    rows = []
    for name, by_prior in results["readings"].items():
        scores = by_prior["default"]["per_question"]
        row = []
        for b in names:
            ids = [q for q in scores if bucket_of[q] == b]
            f1 = sum(scores[q]["f1"] for q in ids) / len(ids)
            gap = (f" ({f1 - sum(baseline[q]['f1'] for q in ids) / len(ids):+.1f})"
                   if baseline and name != baseline_name else "")
            row.append(f"{f1:.1f}{gap}")
        rows.append(f"| {name} | " + " | ".join(row) + " |")
    return rows


def by_answer_paragraph(results: dict, baseline: str | None = None) -> list[str]:
    """Mean F1 by which of its article's paragraphs holds the answer (the first, second, third, a later one), for
    every reading with the default prior, with the difference from the baseline (the results' first unless named) on
    the same questions (round 24)."""
    baseline = baseline or results["baseline"]
    paragraph_of = results.get("paragraph_of")
    if not paragraph_of:
        return []
    names = ("1st", "2nd", "3rd", "later")
    bucket_of = {q: names[min(index, 3)] for q, index in paragraph_of.items()}
    lines = ["F1 by the paragraph of its article that holds the answer (the default prior; in brackets the difference "
             f"from `{baseline}` on the same questions; questions per bucket in the header):", "",
             "| reading | " + " | ".join(f"{b} ({sum(v == b for v in bucket_of.values())})" for b in names) + " |",
             "|---|" + "---:|" * len(names)]
    return lines + bucket_rows(results, bucket_of, names, baseline)


def table(results: dict) -> list[str]:
    sizes = results["bucket_sizes"]
    lines = provenance(results) + [
        f"{results['questions']} dev-side questions of {results['articles']} articles "
        f"({', '.join(f'{b}: {n}' for b, n in sizes.items())}), the paragraph reader "
        f"({'bf16 autocast' if results['bf16'] else 'fp32'}). Intervals and paired differences resample **articles**;"
        f" the paired difference is against `{results.get('baseline', 'sliding')}` with the same prior. Models: "
        + ", ".join(f"`{n}` {m['model']} ({m['reading']})" for n, m in results.get("models", {}).items()) + ".", "",
        "| reading | prior | F1 | first 512 / beyond 512 | − baseline (95 % CI) | CPU min |",
        "|---|---|---:|---:|---:|---:|"]
    for name, by_prior in results["readings"].items():
        for reading, summary in by_prior.items():
            paired = summary["all"].get("f1_vs_baseline")
            lines.append(
                f"| {name} | {reading} | {cell(summary['all'])} | "
                + " / ".join(f"{summary[b]['f1']:.1f}" for b in BUCKETS if b in summary)
                + (f" | {paired['difference']:+.1f} ({paired['low']:+.1f} to {paired['high']:+.1f})" if paired
                   else " | ")
                + f" | {results['cpu_seconds'][name] / 60:.1f} |")
    trained = {n: m["training"] for n, m in results.get("models", {}).items() if m.get("training")}
    if trained:
        lines.append("")
        lines += [f"`{n}` trained ({t['layout']['variant']}, {t['layout']['segments'] or 'all'} segments per question"
                  f"{' (distractors: BM25)' if t['layout'].get('distractors') == 'bm25' else ''}, "
                  f"ranking weight {t['layout']['ranking_weight']}) for {t['cpu_seconds'] / 60:.1f} CPU minutes "
                  f"(budget {t['cpu_budget_minutes']:g}): {t['updates']} updates, {t['questions']} questions, "
                  f"{t['tokens_seen']:,} tokens." for n, t in trained.items() if "layout" in t]
    fitted = {n: m["cross_fitted"]["chosen_by_half"] for n, m in results.get("models", {}).items()
              if m.get("cross_fitted")}
    lead = {n: m["lead"]["chosen_by_half"] for n, m in results.get("models", {}).items() if m.get("lead")}
    if fitted:
        lines += ["", "`cross-fitted`: each half of the articles read with the prior (radius:weight) best on the other "
                  "half; chosen for halves 0 / 1: " + "; ".join(
                      f"`{n}` {' / '.join(str(c[h]) for h in sorted(c))}" for n, c in fitted.items()) + "."]
    if lead:
        lines += ["", "`lead`: each half read with the lexical prior (radius:weight) and the lead prior (the bonus "
                  "after +, for spans in the article's first paragraph) best on the other half; chosen for halves "
                  "0 / 1: " + "; ".join(f"`{n}` {' / '.join(str(c[h]) for h in sorted(c))}" for n, c in lead.items())
                  + "."]
    return lines


if __name__ == "__main__":
    main()
