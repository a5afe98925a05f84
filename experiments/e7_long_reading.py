"""E7: long reading at an equal CPU budget: does a longbird long reader beat sliding 512-token windows of its own short
source on whole unseen KorQuAD 1.0 articles? (issue 24)

Protocol.
- Data: the 140 KorQuAD 1.0 dev articles joined into whole-article contexts, split by article (seed 0, 20 % dev; the
  split of `evaluate --split dev`). Dev questions are drawn *by article*: whole dev-side articles in a seeded order
  until at least `--min-dev-questions` questions and `--min-beyond` answers beyond the first 512 tokens are in
  (defaults 300 and 150). Training uses the questions of the train-side articles. The script asserts that no title
  and no context hash is on both sides, and that the reader was fine-tuned on the train side only; both lists go
  into the results JSON.
- Start: every method starts from the same paragraph reader (`make qa-model`), converted to the method's preset with
  its QA head kept (E4's `from_reader`).
- Budget: every method trains for the same `--cpu-minutes` of process CPU time (all threads; a distillation
  teacher's reading counts), at a constant learning rate, and reports its updates and real tokens. Batches are
  length-grouped; `--batch-tokens` sets about as many tokens per update for every method (16 x 512 by default).
- Baseline: sliding-512, the reader trained further on whole-article 512-token windows (doc_stride 128, windows
  without the answer kept with p = `--negative-fraction`) and read the same way, merged with the library's
  cross-window scoring (`qa.DEFAULT_SCORING`, chosen on the training side; experiments/cross_window_scoring.py).
- Long methods read each article in one window of up to 4096 tokens (an article longer than that in windows of 4096
  sharing 1024), trained on windows of the articles' own lengths (no padding to 4096).
- Scores: the official KorQuAD 1.0 EM/F1 overall, for answers starting in the first 512 tokens of
  `[CLS] question [SEP] article` and beyond, each with a 95 % percentile-bootstrap interval over questions, and the
  paired difference of every method against the baseline (same questions resampled together).

Methods (ablation rows of issue 24; `--methods` picks):
- sliding-512: the baseline above.
- kobigbird-long / kobigbird-long-exp: BigBird ITC at 4096 with TAPER `copy` / `exp` (tau 2) beyond 512.
- kobigbird-long-copy64 / -local / -b128 (round 2): TAPER `copy` repeating rows 64..511 only (`taper_start`, so no
  document token takes a question position), -local without random blocks, -b128 at block 128 (rows 128..511,
  384-token windows) without random blocks, -b128r the same with 3 random blocks, -b256 at block 256 (rows
  256..511, 768-token windows) without random blocks; chosen zero-shot on validation articles by
  e7_conversion_probe.py.
- kobigbird-long-teacher: kobigbird-long trained with the sliding reader as teacher (training/sliding_teacher.py):
  the reader's merged span distributions over each training window as soft targets beside the gold labels.
- kobigbird-1k: kobigbird-long's conversion trained on 1024-token windows (stride 512; cheaper long examples, more
  questions per CPU minute) and read whole at 4096; kobigbird-1k-sliding reads the same model in sliding 1024-token
  windows (stride 512; no training of its own).
- sliding-512-untrained, kobigbird-long-b128-untrained: the round-2 rows' starting points read with no article
  training (0 CPU minutes): with the trained rows, the first two points of each learning curve.
- kobigbird-long-b128q (round 3) and its -untrained start: -b128 with `global_blocks="first-reads-source"`: the
  question stays global as keys, but its own queries read the first 512 tokens (what they read in the paragraph
  reader) and there is no last global block.
- kobigbird-long-b128qn (round 4) and its -untrained start: -b128q with regional nulls (`qa_null_every=128`,
  data/null_regions.py): a [CLS] with position 0 before every 128 article tokens past the first 512, the start loss
  a softmax per region (the answer's region targets it, every other region its null) and spans scored against their
  region's null, as sliding windows score against their window's [CLS].
- kobigbird-long-b128qnc (round 5) and its -untrained start: -b128q with `local_windows="source-chunks"`
  (attention/patterns.py): the blocks after the question block are tiled into chunks of three (384 tokens) that read
  the question block and themselves, so each chunk is a 512-token window whose copied positions run in order, and
  the first 512 tokens read each other as in the paragraph reader; one regional null per chunk
  (`qa_null_every=383`).
- kobigbird-long-b128qn-from-sliding (round 6): no long training at all. The model sliding-512 trained (its whole
  budget spent on 512-token windows, about 9x the supervised questions per CPU minute of whole articles) converted
  again with -b128qn's conversion and read whole: what "train short, read long" gives at the same budget.
- littlebird-long, littlebird-long-teacher: LittleBird (BiALiBi, sliding window, pack & unpack) at 4096.
- littlebird-short-pi (round 7): LittleBird trained as sliding-512 is (512-token windows, stride 128, the same batch)
  with Padding Insertion (LittleBird §3.4), read whole at 4096; littlebird-short-pi-w512 reads the same model in
  512-token windows (no training of its own).
- kobigbird-long-b128qn-cuts (round 8): -b128qn trained on 512-token cuts of its own long windows
  (data/layout_cuts.py: the question block, then 384 consecutive tokens, each with its whole-article position id and
  regional null), as many per question as sliding windows and batched as they are: a sliding window's cost, the long
  reading's positions; read whole at 4096.
- kobigbird-long-b128qn-cuts-ranked (round 10): -cuts with half of the start loss the cross-region ranking term
  (`qa_ranking_weight=0.5`, region_losses.cross_region_ranking_loss): the null-relative scores decoding ranks spans by, one
  softmax over every region of the cut, where the per-region loss never compares two regions.
- tape-long-b128qn-cuts-ranked (round 11): TAPE, the third method, on the -cuts-ranked route: the same conversion
  with TAPE position states (`preset="tape"`, BigBird attention, identity init, so it starts equal to the kobigbird
  conversion), every weight trained at the row's rate and the TAPE maps, zero at init, at 1e-3
  (`tape_learning_rate`): contextual position states that could tell apart the copied positions past 512.
- kobigbird-long-b128qn-cuts-ranked-teacher (round 12): -cuts-ranked with the paragraph reader as teacher on every
  cut (training/cut_teacher.py, weight `--teacher-weight`): the reader reads the cut's text (its nulls left out) in one
  window of its own layout, and its null-relative scores, every null at 0, are soft targets per region and across
  regions: what the long layout costs near the answer (round 10) taught back by the reader that does not pay it.
- kobigbird-long-b128qn-cuts-ranked-teacher-within (round 12): the same with `teacher_targets="within-region"`: per
  region the teacher's distribution over the region's own tokens (its null left out) and no ranking term, so the
  teacher says where in a region the answer would start and the gold labels alone say whether it is there.
- kobigbird-long-b128qn-cuts-ranked-teacher-marginal (round 12): `teacher_targets="marginal"`: the teacher's one
  softmax over the cut marginalised per region, each token its probability and the region's null the rest (the
  answer starts elsewhere or nowhere), and the ranking term as in -teacher.
- sliding-512-linked-ranked (round 13): sliding-512's windows, linked (linked_windows.py): the paragraph reader with a
  gated exchange between the [CLS] states of one question's windows in every layer (zero at init: it reads as
  sliding-512's start), trained on groups of at most 4 windows of a question (every window with the answer, the rest
  drawn from its other windows; data/window_groups.py) with half of the start loss one softmax over the null-relative
  scores of the group's windows (`qa_ranking_weight=0.5`), the gates at their own rate; read in sliding 512-token
  windows, every window of a question in one batch and linked. Every window is what the source reads (no copied
  positions, no regional nulls), and the windows of a document can compare what they read.
- sliding-512-linked-ranked-g2 (round 13): the same with groups of at most 2 windows (the answer's window and one
  other of its question), 8 groups per update: twice the questions per update of groups of 4.
- sliding-512-grouped-ranked-g2 (round 13): -g2 with the gates at the rows' rate (5e-5), so that they stay near zero:
  the same groups and cross-window ranking term with the windows practically unlinked.
- sliding-512-linked-ranked-lexical-g2 (round 14): -linked-ranked-g2 with the window without the answer chosen as the
  one whose text matches the question best by BM25 (`linked_negatives="lexical"`, data/window_groups.py) instead of
  at random: the ranking term contrasts the answer's window with its likeliest distractor (Clark & Gardner 2018).
- sliding-512-grouped-ranked-lexical-g2 (round 14): the same with the gates at the rows' rate (practically
  unlinked): what the distractors do without the links.
- sliding-512-grouped-lexical-g2 (round 14): -grouped-ranked-lexical-g2 without the ranking term: every window's own
  start loss only, so sliding-512's training on the answer's windows and one distractor per question.
- sliding-512-linked-ranked-lexical-g3 (round 14): -lexical-g2 with groups of at most 3 windows: the answer's window
  and the question's two best BM25 matches without the answer (5 groups per update).
- sliding-512-linked-selector-lexical-g2 (round 15): -grouped-lexical-g2's groups and per-window loss, linked (gates
  at 5e-3), with the window selector (`qa_selector_weight=0.5`, window_selector.py): a head on each window's [CLS]
  that corrects its null-relative "answer here" score, trained by one softmax per question over its windows (the
  span logits held fixed in it) at the gates' rate, and added at decoding.
- full-long: dense attention at 4096 (an upper reference on the CPU).

Usage: python experiments/e7_long_reading.py --reader qa-model/kobigbird-e5-korquad [--cpu-minutes 60]
       [--methods ...] [--seed 0] [--resume] [--report] [--name e7_long_reading]
Writes experiments/results/NAME.{json,md,png} and NAME_predictions/; models go to experiments/runs/NAME/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "experiments"))

from e4_korquad_articles import BUCKETS, answer_buckets, from_reader  # noqa: E402

from longbird.checkpoints import load_task_model  # noqa: E402
from longbird.data.corpus import held_out_record  # noqa: E402, F401  (experiments import it from here)
from longbird.data.korquad import read_korquad_v1_articles, split_by_title  # noqa: E402
from longbird.files import save_figure_atomically, write_file_atomically  # noqa: E402
from longbird.heads import LongBirdForQuestionAnswering  # noqa: E402
from longbird.metrics.intervals import bucket_summary  # noqa: E402
from longbird.precision import bf16_autocast, native_bf16, store_encoder_linears_in  # noqa: E402
from longbird.qa import DEFAULT_SCORING, predict_rows  # noqa: E402
from longbird.tasks.qa import finetune_qa, per_question_scores, question_limit, require_trained_apart  # noqa: E402
from longbird.training.finetune import FinetuneSettings  # noqa: E402

SOURCE_WINDOW, BASELINE = 512, "sliding-512"
LONG, MID = 4096, 1024
COPY, EXP = {"taper_schedule": "copy"}, {"taper_schedule": "exp", "taper_tau": 2.0}


class Method(NamedTuple):
    """One E7 row: how the reader is converted, trained and read."""

    preset: str
    length: int  # the converted model's maximum length
    window: int  # training windows: whole articles up to this length, or sliding windows of it
    stride: int  # doc_stride of the training windows
    overrides: dict  # conversion overrides (TAPER schedule)
    teacher: bool = False  # distil from the sliding reader
    read_window: int | None = None  # default: the training window
    read_stride: int | None = None
    trained_by: str | None = None  # read the model another row trained (no training of its own)
    untrained: bool = False  # read the conversion as it starts (0 CPU minutes: where the training budget starts from)
    reconverted: bool = False  # with trained_by: that row's trained model converted with this row's settings
    padding_insertion: bool = False  # train with Padding Insertion (LittleBird §3.4: gaps in the position ids)
    cut: int | None = None  # train on cuts of this many tokens from the long windows (data/layout_cuts.py)
    tape_learning_rate: float | None = None  # the TAPE maps' own rate (FinetuneSettings.tape_learning_rate)
    teacher_targets: str = "null-relative"  # on cuts: what the teacher's start scores teach (training/cut_teacher.py)
    linked: int | None = None  # train linked windows on groups of at most this many windows (data/window_groups.py)
    link_learning_rate: float | None = None  # the link gates' own rate (FinetuneSettings.link_learning_rate)
    linked_negatives: str = "random"  # a linked group's windows without the answer: "random" or "lexical" (BM25)

    @property
    def reading(self) -> tuple[int, int]:
        return self.read_window or self.window, self.read_stride or self.stride


B128Q = COPY | {"taper_start": 128, "block_size": 128, "num_random_blocks": 0, "global_blocks": "first-reads-source"}
B128QN = B128Q | {"qa_null_every": 128}
B128QNC = B128Q | {"local_windows": "source-chunks", "qa_null_every": 383}
METHODS = {
    "sliding-512": Method("full", SOURCE_WINDOW, SOURCE_WINDOW, 128, {}),
    "kobigbird-long": Method("kobigbird", LONG, LONG, 1024, COPY),
    "kobigbird-long-exp": Method("kobigbird", LONG, LONG, 1024, EXP),
    "kobigbird-long-teacher": Method("kobigbird", LONG, LONG, 1024, COPY, teacher=True),
    # cheaper long examples: 1024-token windows (sparse attention, copied positions beyond 512), about 4x the
    # supervised questions per CPU minute of whole articles; read whole (4096) and in sliding 1024-token windows
    "kobigbird-1k": Method("kobigbird", LONG, MID, 512, COPY, read_window=LONG, read_stride=1024),
    "kobigbird-1k-sliding": Method("kobigbird", LONG, MID, 512, COPY, read_window=MID, read_stride=512,
                                   trained_by="kobigbird-1k"),
    # round 2 (experiments/e7_conversion_probe.py chose among these zero-shot): the document's repeated positions
    # cycle over rows 64..511 (never the question's rows), without random blocks, at block 64 or 128
    "kobigbird-long-copy64": Method("kobigbird", LONG, LONG, 1024, COPY | {"taper_start": 64}),
    "kobigbird-long-local": Method("kobigbird", LONG, LONG, 1024, COPY | {"taper_start": 64, "num_random_blocks": 0}),
    "kobigbird-long-b128": Method("kobigbird", LONG, LONG, 1024, COPY | {"taper_start": 128, "block_size": 128,
                                                                         "num_random_blocks": 0}),
    "kobigbird-long-b128r": Method("kobigbird", LONG, LONG, 1024, COPY | {"taper_start": 128, "block_size": 128}),
    "kobigbird-long-b256": Method("kobigbird", LONG, LONG, 1024, COPY | {"taper_start": 256, "block_size": 256,
                                                                         "num_random_blocks": 0}),
    # the starting points of the two round-2 rows, read with no article training at all
    "sliding-512-untrained": Method("full", SOURCE_WINDOW, SOURCE_WINDOW, 128, {}, untrained=True),
    "kobigbird-long-b128-untrained": Method("kobigbird", LONG, LONG, 1024, COPY | {
        "taper_start": 128, "block_size": 128, "num_random_blocks": 0}, untrained=True),
    # round 3: -b128 with the question global as keys only (global_blocks="first-reads-source": the question's own
    # queries read the first 512 tokens, as in the paragraph reader, and there is no last global block); chosen
    # zero-shot on validation articles by e7_conversion_probe.py (kobigbird-b128-copy128-norandom-q)
    "kobigbird-long-b128q": Method("kobigbird", LONG, LONG, 1024, B128Q),
    "kobigbird-long-b128q-untrained": Method("kobigbird", LONG, LONG, 1024, B128Q, untrained=True),
    # round 4: -b128q with a null per 128-token region (e7_regional_null.py's zero-shot probe: +4.6 F1 at region 128)
    "kobigbird-long-b128qn": Method("kobigbird", LONG, LONG, 1024, B128QN),
    "kobigbird-long-b128qn-untrained": Method("kobigbird", LONG, LONG, 1024, B128QN, untrained=True),
    # round 5: -b128q whose middle blocks read source-length chunks (blocks 1-3, 4-6, ...) with the question block
    # instead of sliding windows, so every chunk reads its copied positions in order (local_windows="source-chunks"),
    # with one null per chunk (383 article tokens + the null = 3 blocks); chosen over a null per 128 tokens zero-shot
    # on validation articles (e7_local_windows_validation: 71.2 against 69.2)
    "kobigbird-long-b128qnc": Method("kobigbird", LONG, LONG, 1024, B128QNC),
    "kobigbird-long-b128qnc-untrained": Method("kobigbird", LONG, LONG, 1024, B128QNC, untrained=True),
    # round 6: the sliding row's trained model converted to round 4's long reader (no long training; same budget)
    "kobigbird-long-b128qn-from-sliding": Method("kobigbird", LONG, LONG, 1024, B128QN, trained_by=BASELINE,
                                                 reconverted=True),
    "littlebird-long": Method("littlebird", LONG, LONG, 1024, {}),
    # round 7: LittleBird's own low-resource route, train short with Padding Insertion and read long: the reader
    # converted to LittleBird (BiALiBi instead of absolute positions; zero-shot F1 2.5 on the probe's validation
    # questions), trained on 512-token windows of the articles as sliding-512 is (same windows, batch and budget) with
    # gaps inserted into the position ids, read whole; and the same model read in 512-token windows
    "littlebird-short-pi": Method("littlebird", LONG, SOURCE_WINDOW, 128, {}, read_window=LONG, read_stride=1024,
                                  padding_insertion=True),
    "littlebird-short-pi-w512": Method("littlebird", LONG, SOURCE_WINDOW, 128, {}, read_window=SOURCE_WINDOW,
                                       read_stride=128, trained_by="littlebird-short-pi", padding_insertion=True),
    # round 8: round 4's long reader trained on 512-token cuts of its own long layout (the question block, then 384
    # consecutive tokens with their whole-article positions and nulls; cuts overlapping by about 128 tokens, as the
    # sliding windows): a sliding window's cost per question, the long reading's positions; read whole
    "kobigbird-long-b128qn-cuts": Method("kobigbird", LONG, LONG, 1024, B128QN, cut=SOURCE_WINDOW),
    # round 10: the same, with the ranking decoding does trained across the regions of a cut
    "kobigbird-long-b128qn-cuts-ranked": Method("kobigbird", LONG, LONG, 1024, B128QN | {"qa_ranking_weight": 0.5},
                                                cut=SOURCE_WINDOW),
    # round 11: the third method, TAPE, on round 10's route: the same conversion with TAPE position states over it
    # (identity init: equal to the kobigbird conversion before training, tests/test_null_regions.py), every weight
    # trained as in every row, the TAPE maps (zero at init) at their own rate so that 30 CPU minutes can move them
    "tape-long-b128qn-cuts-ranked": Method("tape", LONG, LONG, 1024,
                                           B128QN | {"attention": "bigbird", "qa_ranking_weight": 0.5},
                                           cut=SOURCE_WINDOW, tape_learning_rate=1e-3),
    # round 12: round 10's route with the paragraph reader as teacher on every cut (training/cut_teacher.py): it reads
    # the cut's text in one window of its own layout and its null-relative scores are soft targets in the long layout
    "kobigbird-long-b128qn-cuts-ranked-teacher": Method("kobigbird", LONG, LONG, 1024,
                                                        B128QN | {"qa_ranking_weight": 0.5}, cut=SOURCE_WINDOW,
                                                        teacher=True),
    # round 12, second row: the teacher's start scores only within each region (its null left to the gold labels):
    # where in a region, not whether; the first row's null-relative targets carry a window-level "not here"
    "kobigbird-long-b128qn-cuts-ranked-teacher-within": Method("kobigbird", LONG, LONG, 1024,
                                                               B128QN | {"qa_ranking_weight": 0.5}, cut=SOURCE_WINDOW,
                                                               teacher=True, teacher_targets="within-region"),
    # round 12, third row: the teacher's window distribution marginalised per region (a region's null gets the
    # probability that the answer starts anywhere else or nowhere): a region's "not here", not the window's
    "kobigbird-long-b128qn-cuts-ranked-teacher-marginal": Method("kobigbird", LONG, LONG, 1024,
                                                                 B128QN | {"qa_ranking_weight": 0.5},
                                                                 cut=SOURCE_WINDOW, teacher=True,
                                                                 teacher_targets="marginal"),
    # round 13: sliding windows that read each other: the paragraph reader with linked windows (the [CLS] states of
    # one question's windows exchanged through a gate per layer, zero at init), trained on groups of 4 windows of a
    # question with the cross-window ranking term, the gates at 5e-3 (set before the run, not tuned)
    "sliding-512-linked-ranked": Method("full", SOURCE_WINDOW, SOURCE_WINDOW, 128,
                                        {"linked_windows": True, "qa_ranking_weight": 0.5}, linked=4,
                                        link_learning_rate=5e-3),
    # round 13, second row: groups of 2 (the answer's window and one other), twice the questions per update: round 13's
    # first row read near the answer 2.9 below sliding-512 on a quarter of its questions
    "sliding-512-linked-ranked-g2": Method("full", SOURCE_WINDOW, SOURCE_WINDOW, 128,
                                           {"linked_windows": True, "qa_ranking_weight": 0.5}, linked=2,
                                           link_learning_rate=5e-3),
    # round 13, third row: -g2 with the gates at the rows' 5e-5 (so they stay near zero: the windows practically
    # unlinked), the same groups and ranking term: what the links add to the grouped training
    "sliding-512-grouped-ranked-g2": Method("full", SOURCE_WINDOW, SOURCE_WINDOW, 128,
                                            {"linked_windows": True, "qa_ranking_weight": 0.5}, linked=2),
    # round 14: -linked-ranked-g2 and -grouped-ranked-g2 with the window without the answer the question's best BM25
    # match among its windows (its likeliest distractor) instead of a random one: round 13 found the windows without
    # the answer to be what teaches the ranking
    "sliding-512-linked-ranked-lexical-g2": Method("full", SOURCE_WINDOW, SOURCE_WINDOW, 128,
                                                   {"linked_windows": True, "qa_ranking_weight": 0.5}, linked=2,
                                                   link_learning_rate=5e-3, linked_negatives="lexical"),
    "sliding-512-grouped-ranked-lexical-g2": Method("full", SOURCE_WINDOW, SOURCE_WINDOW, 128,
                                                    {"linked_windows": True, "qa_ranking_weight": 0.5}, linked=2,
                                                    linked_negatives="lexical"),
    # round 14, fourth row: -grouped-ranked-lexical-g2 without the cross-window ranking term (qa_ranking_weight 0): each
    # window's own start loss only, on the answer's window and its distractor, i.e. sliding-512's training with the
    # windows without the answer chosen by BM25 (one per question) instead of drawn at 10 %
    "sliding-512-grouped-lexical-g2": Method("full", SOURCE_WINDOW, SOURCE_WINDOW, 128,
                                             {"linked_windows": True, "qa_ranking_weight": 0.0}, linked=2,
                                             linked_negatives="lexical"),
    # round 14, third row: groups of 3 (the answer's window and the question's two best BM25 matches without it): the
    # lexical g2 row ranked at a cost of 4.2 F1 (sliding-512 6.0); does a second distractor lower it further?
    "sliding-512-linked-ranked-lexical-g3": Method("full", SOURCE_WINDOW, SOURCE_WINDOW, 128,
                                                   {"linked_windows": True, "qa_ranking_weight": 0.5}, linked=3,
                                                   link_learning_rate=5e-3, linked_negatives="lexical"),
    # round 15: -grouped-lexical-g2's groups and per-window loss, linked, with the window selector (window_selector.py):
    # the ranking trained in a head of its own on the linked [CLS] rather than through the start head, which in round 14
    # ranked better (4.2 F1 against 6.0) and read worse near the answer (79.6 against 80.5)
    "sliding-512-linked-selector-lexical-g2": Method("full", SOURCE_WINDOW, SOURCE_WINDOW, 128,
                                                     {"linked_windows": True, "qa_ranking_weight": 0.0,
                                                      "qa_selector_weight": 0.5}, linked=2,
                                                     link_learning_rate=5e-3, linked_negatives="lexical"),
    "littlebird-long-teacher": Method("littlebird", LONG, LONG, 1024, {}, teacher=True),
    "full-long": Method("full", LONG, LONG, 1024, COPY),
}


def draw_dev_articles(dev, tokenizer, min_questions: int, min_beyond: int, seed: int = 0):
    """Whole dev-side articles in a seeded order until both thresholds are met: (questions, their buckets)."""
    titles = sorted(set(dev["title"]))
    order = torch.randperm(len(titles), generator=torch.Generator().manual_seed(seed)).tolist()
    buckets_of_all = answer_buckets(dev, tokenizer)
    chosen, questions, beyond = set(), 0, 0
    for index in order:
        if questions >= min_questions and beyond >= min_beyond:
            break
        title = titles[index]
        ids = [row["id"] for row in dev if row["title"] == title]
        chosen.add(title)
        questions += len(ids)
        beyond += sum(buckets_of_all[i] == "beyond 512" for i in ids)
    if questions < min_questions or beyond < min_beyond:
        raise SystemExit(f"the dev side holds only {questions} questions ({beyond} beyond 512 tokens): fewer than "
                         f"--min-dev-questions {min_questions} / --min-beyond {min_beyond}")
    rows = dev.filter(lambda row: row["title"] in chosen)
    return rows, {row["id"]: buckets_of_all[row["id"]] for row in rows}


def article_tokens(dev, tokenizer) -> dict[str, int]:
    """Tokens of each dev article (its context alone, no question): the length the long readers read at once."""
    contexts = {row["title"]: row["context"] for row in dev}
    return {title: len(tokenizer(context, add_special_tokens=False, verbose=False)["input_ids"])
            for title, context in sorted(contexts.items())}


def summarise(scores: dict[str, dict], buckets: dict[str, str], baseline: dict[str, dict] | None) -> dict:
    """Per bucket: questions, EM, F1 with bootstrap intervals, and the paired F1 difference against the baseline."""
    return bucket_summary(scores, buckets, BUCKETS, baseline)


def train_method(name: str, start: Path, train, run_dir: Path, args, reader: Path) -> dict:
    method = METHODS[name]
    window, stride = method.window, method.stride
    # sliding windows share the token budget per update (--batch-tokens); whole articles come --long-batch-size at once
    tokens = (method.cut or window) * (method.linked or 1)  # a linked row's batch counts groups of windows
    batch = max(1, round(args.batch_tokens / tokens)) if tokens < LONG else args.long_batch_size
    settings = FinetuneSettings(learning_rate=args.learning_rate, max_steps=args.max_steps, batch_size=batch,
                                bf16=args.bf16, progress=True, logging_steps=10, group_by_length=True,
                                lr_scheduler="constant", warmup_ratio=0.0, cpu_minutes=args.cpu_minutes,
                                padding_insertion=method.padding_insertion,
                                tape_learning_rate=method.tape_learning_rate,
                                link_learning_rate=method.link_learning_rate, seed=args.seed)
    metrics = finetune_qa(start, train, run_dir, data_format="korquad1-articles", window_length=window,
                          doc_stride=stride, negative_fraction=args.negative_fraction, settings=settings,
                          overwrite=True, teacher=reader if method.teacher else None,
                          teacher_weight=args.teacher_weight, teacher_targets=method.teacher_targets,
                          cut_windows=method.cut, cut_overlap=128, linked_groups=method.linked,
                          linked_negatives=method.linked_negatives)
    history = metrics["log_history"]
    return {"batch_size": batch, "cpu_budget": metrics["cpu_budget"], "tokens_seen": metrics["tokens_seen"],
            "training_windows": metrics["training_windows"], "windows": metrics["windows"],
            "loss_curve": [(entry["step"], entry["loss"]) for entry in history if "loss" in entry]}


def evaluate_method(run_dir: Path, dev, window: int, stride: int, bf16: bool):
    model, tokenizer = load_task_model(run_dir, LongBirdForQuestionAnswering)
    if bf16:  # the same arithmetic as autocast over fp32 weights, without its casts
        store_encoder_linears_in(model)
    started = time.process_time()
    with bf16_autocast("cpu", bf16):
        answers = predict_rows(model, tokenizer, dev, window, stride,
                               batch_size={SOURCE_WINDOW: 8, MID: 4}.get(window, 2), scoring=DEFAULT_SCORING,
                               max_question_tokens=question_limit(model, tokenizer, window), progress=True,
                               lexical_weight=0.0)  # E7's protocol; experiments/lexical_prior.py adds the prior
    predictions = {row["id"]: answers[row["id"]].text if row["id"] in answers else "" for row in dev}
    return predictions, time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reader", type=Path, required=True, help="The paragraph reader (make qa-model) to start from")
    parser.add_argument("--cpu-minutes", type=float, default=60.0, help="Training budget of every method")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--min-dev-questions", type=int, default=300)
    parser.add_argument("--min-beyond", type=int, default=150)
    parser.add_argument("--batch-tokens", type=int, default=16 * SOURCE_WINDOW, help="Tokens per update at 512")
    parser.add_argument("--long-batch-size", type=int, default=4, help="Whole-article windows per update")
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--negative-fraction", type=float, default=0.1)
    parser.add_argument("--teacher-weight", type=float, default=0.5)
    parser.add_argument("--max-steps", type=int, default=100_000, help="Upper bound; the CPU budget stops a run")
    parser.add_argument("--seed", type=int, default=0,
                        help="Training seed of every method (data order, dropout, random windows); not the draw of "
                             "the test articles, which stays seed 0")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    parser.add_argument("--name", default="e7_long_reading")
    parser.add_argument("--resume", action="store_true", help="Keep the finished methods of an earlier run")
    parser.add_argument("--report", action="store_true",
                        help="Rewrite the table and plot from the results file (with --resume's settings check); "
                             "train and read nothing")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    parser.add_argument("--work", type=Path, default=None, help="Default: experiments/runs/NAME")
    args = parser.parse_args()
    args.bf16 = args.precision == "bf16" or (args.precision == "auto" and native_bf16("cpu"))
    args.work = args.work or ROOT / "experiments" / "runs" / args.name
    rows, _ = read_korquad_v1_articles(DATA / "korquad" / "KorQuAD_v1.0_dev.json")
    split = split_by_title(rows)
    train = split["train"]
    _, tokenizer = load_task_model(args.reader, LongBirdForQuestionAnswering)
    dev, buckets = draw_dev_articles(split["dev"], tokenizer, args.min_dev_questions, args.min_beyond)
    held_out = held_out_record(train, dev)
    require_trained_apart(args.reader, set(split["dev"]["title"]), root=ROOT)  # the reader never read a dev article
    # the seed is a setting only when not 0, so results files written before --seed existed still resume
    settings = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()
                if key not in ("methods", "resume", "report") and not (key == "seed" and value == 0)}
    results_path = args.out / f"{args.name}.json"
    results = {"command": "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "settings": settings,
               "machine": None if args.report else machine(), "train_questions": len(train),
               "train_articles": len(set(train["title"])),
               "dev_questions": len(dev), "dev_articles": len(set(dev["title"])),
               "dev_bucket_sizes": {b: list(buckets.values()).count(b) for b in BUCKETS}, "held_out": held_out,
               "scoring": DEFAULT_SCORING, "dev_article_tokens": article_tokens(dev, tokenizer),
               "dev_question_article": {row["id"]: row["title"] for row in dev}, "methods": {}}
    if args.report:
        if not results_path.exists():
            raise SystemExit(f"--report rewrites {results_path}, which does not exist: run the methods first")
        args.resume, args.methods = True, []
    if args.resume and results_path.exists():
        old = json.loads(results_path.read_text())
        if old["settings"] != settings:
            raise SystemExit(f"--resume needs the settings of {results_path}: {old['settings']}")
        # a row that rereads a model trained again now would score the old model: it goes too
        results["methods"] = {k: v for k, v in old["methods"].items()
                              if k not in args.methods and v.get("trained_by", k) not in args.methods}
        results["command"] = old["command"] + (" && " + results["command"] if args.methods else "")
        results["machine"] = results["machine"] or old["machine"]  # --report: the machine the rows ran on
    order = [BASELINE] + [m for m in args.methods if m != BASELINE] if BASELINE in args.methods else args.methods
    order.sort(key=lambda m: METHODS[m].trained_by is not None)  # a row's trainer before the rows that reread it
    if args.report:
        write_results(results, buckets, args.out, args.name)
    for name in order:
        method = METHODS[name]
        trained_by = method.trained_by or name
        run_dir = args.work / trained_by
        if method.trained_by:  # the model of another row, read another way: its training record, no training here
            if trained_by not in results["methods"]:
                raise SystemExit(f"{name} reads the model of {trained_by}: run {trained_by} first (--methods "
                                 f"{trained_by} {name})")
            trained = {key: value for key, value in results["methods"][trained_by].items()
                       if key in ("batch_size", "cpu_budget", "tokens_seen", "training_windows", "windows",
                                  "loss_curve", "machine")}
            trained.setdefault("machine", None)  # the training CPU minutes were the trainer's: its machine or none
            if method.reconverted:  # converting copies weights: no CPU minutes beyond the trainer's
                shutil.rmtree(args.work / name, ignore_errors=True)  # never an earlier conversion of a retrained model
                run_dir = from_reader(run_dir, method.preset, method.length, method.overrides, args.work / name)
        elif method.untrained:  # the conversion read as it is: the 0-minute point of the row's learning curve
            run_dir = from_reader(args.reader, method.preset, method.length, method.overrides, args.work)
            trained = {"batch_size": 0, "cpu_budget": {"minutes": 0.0, "cpu_seconds": 0.0, "steps": 0},
                       "tokens_seen": 0, "training_windows": 0, "windows": 0, "loss_curve": []}
        else:
            start = from_reader(args.reader, method.preset, method.length, method.overrides, args.work)
            trained = train_method(name, start, train, run_dir, args, args.reader)
        window, stride = method.reading
        predictions, eval_seconds = evaluate_method(run_dir, dev, window, stride, args.bf16)
        scores = per_question_scores(predictions, dev, "korquad1-articles")
        trainer = METHODS[trained_by]  # whose training windows the model saw (this row's own unless it rereads one)
        results["methods"][name] = {"machine": results["machine"],  # rows added with --resume may run elsewhere
                                    **trained, "window": window, "doc_stride": stride, "per_question": scores,
                                    "eval_cpu_seconds": eval_seconds, "eval_machine": results["machine"],
                                    "train_window": trainer.window, "train_doc_stride": trainer.stride,
                                    "trained_by": trained_by, "padding_insertion": trainer.padding_insertion,
                                    "train_cut": trainer.cut, "train_linked": trainer.linked,
                                    "train_linked_negatives": trainer.linked_negatives if trainer.linked else None}
        write_file_atomically(args.out / f"{args.name}_predictions" / f"{name}.json",
                              json.dumps(predictions, ensure_ascii=False, indent=1) + "\n")
        write_results(results, buckets, args.out, args.name)
        print(name, json.dumps(results["methods"][name]["summary"]["all"]), flush=True)


def machine() -> dict:
    """What the CPU minutes were spent on: machines differ several-fold, so the matmul rates go beside every time."""
    import os

    from longbird.bench.models import cpu_matmul_rates, describe_matmul_rates
    from longbird.bench.sweep import cpu_model

    rates = cpu_matmul_rates()
    described = describe_matmul_rates(rates)
    summary = (f"{cpu_model()}, {os.cpu_count()} CPUs, ATen {torch.backends.cpu.get_cpu_capability()}, torch "
               f"{torch.__version__}, {torch.get_num_threads()} threads; matmul {described}")
    return {"summary": summary, "matmul_tflops": rates}


def write_results(results: dict, buckets: dict[str, str], out: Path, stem: str) -> None:
    baseline = results["methods"].get(BASELINE, {}).get("per_question")
    for name, method in results["methods"].items():
        method["summary"] = summarise(method["per_question"], buckets, None if name == BASELINE else baseline)
    write_tables(out, stem, results, table(results))
    plot(results, out / f"{stem}.png")


def write_tables(out: Path, stem: str, results: dict, lines: list[str]) -> None:
    """`stem`.json (the results) and `stem`.md (their table), each written whole or not at all. Shared by E7's
    scripts (the probe, the diagnosis, the regional-null probe)."""
    write_file_atomically(out / f"{stem}.json", json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    write_file_atomically(out / f"{stem}.md", "\n".join(lines) + "\n")


def provenance(results: dict) -> list[str]:
    """The first lines of every E7 table: the command and the machine, or each machine with its rows when rows added
    with --resume ran on another (or the same machine at another measured rate: machines differ from run to run)."""
    runs: dict[str, list[str]] = {}
    for name, method in results.get("methods", {}).items():
        if method.get("machine"):
            runs.setdefault(method["machine"]["summary"], []).append(name)
    if len(runs) < 2:
        return [f"Command: `{results['command']}`  ", f"Machine: {results['machine']['summary']}  "]
    return [f"Command: `{results['command']}`  ",
            "Machines: " + "; ".join(f"{summary} ({', '.join(names)})" for summary, names in runs.items()) + "  "]


def score_cells(summary: dict) -> str:
    """"F1 (95 % CI) | EM | F1 first 512 | F1 beyond 512" of one `bucket_summary`, as the probes' tables print it."""
    low, high = summary["all"]["f1_interval"]
    cells = [f"{summary[b]['f1']:.1f}" if b in summary else "" for b in BUCKETS]
    return (f"{summary['all']['f1']:.1f} ({low:.1f}–{high:.1f}) | {summary['all']['exact_match']:.1f} | {cells[0]} | "
            f"{cells[1]}")


def add_output_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """--precision, --name and --out, as every E7 script takes them."""
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    parser.add_argument("--name", default=name)
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")


def wants_bf16(precision: str) -> bool:
    """bf16 autocast when asked for, or with "auto" where the CPU computes bf16 natively."""
    return precision == "bf16" or (precision == "auto" and native_bf16("cpu"))


def table(results: dict) -> list[str]:
    s, sizes = results["settings"], results["dev_bucket_sizes"]
    lines = provenance(results) + [
             f"Every method starts from the paragraph reader {s['reader']} and trains for {s['cpu_minutes']:g} CPU "
             f"minutes (process CPU time, all threads; constant lr {s['learning_rate']:g}, length-grouped batches, "
             f"{'bf16 autocast' if s['bf16'] else 'fp32'}) on the {results['train_questions']:,} questions of "
             f"{results['train_articles']} train-side articles; scored on {results['dev_questions']} questions of "
             f"{results['dev_articles']} unseen articles ({sizes['first 512']} answers in the first 512 tokens, "
             f"{sizes['beyond 512']} beyond), cross-window scoring {results['scoring']}. Held out by article: titles "
             "and context hashes of both sides are in the JSON and asserted disjoint.", "",
             "| method | windows (train / read) | F1 (95 % CI) | EM | F1 first 512 | F1 beyond 512 | "
             "F1 − sliding-512 (paired 95 % CI) | beyond − sliding-512 | updates | tokens | train CPU min | "
             "eval CPU min |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, m in results["methods"].items():
        summary = m["summary"]
        low, high = summary["all"]["f1_interval"]
        cells = [f"{summary[b]['f1']:.1f}" if b in summary else "" for b in BUCKETS]
        diffs = [summary[b].get("f1_vs_baseline") if b in summary else None for b in ("all", "beyond 512")]
        diff_cells = [f"{d['difference']:+.1f} ({d['low']:+.1f} to {d['high']:+.1f})" if d else "—" for d in diffs]
        budget = m["cpu_budget"]
        train_window = m.get("train_window", m["window"])  # rows run before the field existed train as they read
        if m.get("train_cut"):
            train_window = f"{m['train_cut']}-token cuts of {train_window}"
        shared = f" (model of {m['trained_by']})" if m.get("trained_by", name) != name else ""
        lines.append(f"| {name}{shared} | {train_window} / {m['window']} | "
                     f"{summary['all']['f1']:.1f} ({low:.1f}–{high:.1f}) | "
                     f"{summary['all']['exact_match']:.1f} | {cells[0]} | {cells[1]} | {diff_cells[0]} | "
                     f"{diff_cells[1]} | {budget['steps']} | {m['tokens_seen']:,} | {budget['cpu_seconds'] / 60:.1f} "
                     f"| {m['eval_cpu_seconds'] / 60:.1f} |")
    return lines + [""] + by_article(results)


def by_article(results: dict) -> list[str]:
    """F1 of every method on each dev article, shortest first: where (at which article length) a method loses."""
    tokens, owner = results.get("dev_article_tokens"), results.get("dev_question_article")
    if not tokens or not owner:
        return []
    names = list(results["methods"])
    lines = ["F1 per dev article (its questions; tokens of the article alone):", "",
             "| article | tokens | questions | " + " | ".join(names) + " |",
             "|---|---:|---:|" + "---:|" * len(names)]
    for title in sorted(tokens, key=tokens.get):
        ids = [i for i, t in owner.items() if t == title]
        cells = [sum(results["methods"][n]["per_question"][i]["f1"] for i in ids) / len(ids) for n in names]
        lines.append(f"| {title} | {tokens[title]:,} | {len(ids)} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    return lines


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["methods"])
    figure, (bars, curves) = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.27
    for offset, bucket in enumerate(("all",) + BUCKETS):
        values, errors = [], [[], []]
        for name in names:
            entry = results["methods"][name]["summary"].get(bucket)
            f1 = entry["f1"] if entry else 0.0
            low, high = entry["f1_interval"] if entry else (0.0, 0.0)
            values.append(f1)
            errors[0].append(f1 - low)
            errors[1].append(high - f1)
        bars.bar([i + (offset - 1) * width for i in range(len(names))], values, width, yerr=errors, capsize=2,
                 label=f"F1 {bucket}")
    bars.set_xticks(range(len(names)), names, rotation=20, ha="right")
    bars.set_ylabel("KorQuAD 1.0 F1 (%), 95 % CI")
    bars.legend()
    bars.grid(axis="y", alpha=0.3)
    for name in names:
        curve = results["methods"][name]["loss_curve"]
        if curve:
            curves.plot([step for step, _ in curve], [loss for _, loss in curve], label=name)
    curves.set_xlabel("update")
    curves.set_ylabel("training loss")
    curves.legend(fontsize=7)
    curves.grid(alpha=0.3)
    figure.suptitle("E7: whole unseen articles at an equal CPU budget")
    figure.tight_layout()
    save_figure_atomically(figure, path)
    plt.close(figure)


if __name__ == "__main__":
    main()
