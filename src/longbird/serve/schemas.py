"""Requests and responses of `longbird serve` (pydantic): the OpenAPI schema at /docs and /openapi.json is built from
these, and unknown fields are refused (`extra="forbid"`), so a misspelt option is an error rather than ignored."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _a_json_number(value):
    """A count must be sent as a JSON number: `true` is not a top_k of 1, nor "64" a window length (pydantic's lax
    mode would take both); 2.0 stays 2, as a client computing it in floating point sends it."""
    if isinstance(value, (bool, str)):
        raise ValueError("must be a JSON number (not true/false or a string)")
    return value


Count = Annotated[int, BeforeValidator(_a_json_number)]
# the bound inside the type, so that the OpenAPI schema of an optional field keeps it ({"minimum": 1} in its anyOf)
PositiveCount = Annotated[int, Field(ge=1), BeforeValidator(_a_json_number)]
NonNegativeCount = Annotated[int, Field(ge=0), BeforeValidator(_a_json_number)]


class AnswerRequest(Strict):
    question: str = Field(description="The question, in the document's language")
    document: str = Field(description="The document: plain text or an HTML page, as a string (never a path)")
    format: Literal["text", "html", "auto"] = Field("auto", description="auto: HTML when it starts with '<'")
    top_k: Count = Field(1, ge=1, le=20, description="At most how many answers to return, best first, each a "
                                                     "distinct place in the document")
    max_answer_tokens: PositiveCount | None = Field(None, description="Longest span in tokens (default: the model's)")
    window_length: PositiveCount | None = Field(None, description="Window in tokens (default: the trained window)")
    doc_stride: NonNegativeCount | None = Field(None, description="Tokens shared by neighbouring windows")


class AnswerRecord(BaseModel):
    answer: str = Field(description="The answer as a person reads it (tags stripped from an HTML span)")
    source_text: str = Field(description="The raw span of the document")
    start: int = Field(description="Character offset of the span in the document as sent")
    end: int
    score: float = Field(description="The cross-window scoring rule's value plus the lexical prior; higher wins")
    lexical_prior: float = Field(description="The lexical prior's part of score (0 when it is off)")
    probability: float | None = Field(
        description="P(start) P(end | start) within the span's window (its region with regional nulls)")


class AnswerResponse(BaseModel):
    answers: list[AnswerRecord]
    windows: int = Field(description="Windows the document was read in")
    tokens: int = Field(description="Tokens read (all windows)")
    window_length: int
    question_cut: dict | None = Field(None, description="Set when only the question's first tokens were read")
    model: str | None
    elapsed_ms: float


class PipelineInputs(Strict):
    question: str
    context: str


class PipelineParameters(Strict):
    top_k: Count = Field(1, ge=1, le=20)
    doc_stride: NonNegativeCount | None = None
    max_answer_len: PositiveCount | None = Field(None, description="Longest answer in tokens")
    max_seq_len: PositiveCount | None = Field(None, description="Window length in tokens")
    handle_impossible_answer: StrictBool = Field(False, description="Return an empty answer when none is found")


class PipelineRequest(Strict):
    """What clients of transformers' removed question-answering pipeline (and of Inference Endpoints) send."""

    inputs: PipelineInputs
    parameters: PipelineParameters = PipelineParameters()


class PipelineAnswer(BaseModel):
    answer: str
    score: float = Field(
        description="The span's probability in its window, or region with regional nulls (the pipeline's score)")
    start: int
    end: int


class ErrorResponse(BaseModel):
    error: str = Field(description="What went wrong, in a few words")
    detail: str | list = Field(description="The field or value at fault and how to fix it")


class Info(BaseModel):
    model: str | None
    task: Literal["qa", "classification", "encoder"] = Field(
        description="What the model serves: qa (/answer, /predict), classification (/classify); every model /embed")
    labels: list[str] | None = Field(description="A classifier's labels, by class id")
    attention: str
    position: str
    max_length: int
    window_length: int
    window_source: str
    qa_head: str | None = Field(description="A QA model's head (None for other tasks)")
    dtype: str
    device: str
    scoring: str | None = Field(description="A QA model's cross-window scoring rule (None for other tasks)")
    lexical_weight: float = Field(description="Weight of the lexical prior across places (0: off)")
    lexical_radius: int | None = Field(description="Tokens either side of a span's start the prior matches")
    version: str
    limits: dict


class ClassifyRequest(Strict):
    document: str = Field(description="The text to classify")
    window_length: PositiveCount | None = Field(None, description="Window in tokens (default: `serve --window-length`, "
                                        "else the window the model was fine-tuned at, else the model length)")
    stride: NonNegativeCount | None = Field(None, description="Tokens shared by neighbouring windows (default: the "
                                  "stride the model was fine-tuned with, else 128, a quarter of a shorter window)")


class LabelProbability(BaseModel):
    label: str
    probability: float


class ClassifyResponse(BaseModel):
    labels: list[LabelProbability] = Field(description="Every label with its probability, best first")
    windows: int = Field(description="Windows read; their logits are averaged, as `evaluate` does")
    tokens: int = Field(description="Tokens read (all windows)")
    model: str | None
    elapsed_ms: float


class EmbedRequest(Strict):
    inputs: str | list[str] = Field(description="A text or a list of texts")
    pooling: Literal["mean", "cls"] = Field("mean", description="mean: every real token of every window; cls: the "
                                                                "first token of the first window")
    normalize: StrictBool = Field(False, description="Scale each vector to unit length")
    window_length: PositiveCount | None = None


class EmbedResponse(BaseModel):
    embeddings: list[list[float]]
    dimension: int
    windows: int = Field(description="Windows read (all texts; one per text with cls pooling)")
    tokens: int
    model: str | None
    elapsed_ms: float
