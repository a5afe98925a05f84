"""The HTTP application of `longbird serve` (FastAPI): one `Reader` loaded once, routes, limits, errors and metrics.

Every error is JSON `{"error", "detail"}` with the status that says who must act (4xx: the client, with the field
and the fix; 500: the server, whose log has the traceback, which never reaches a client), and the server keeps
serving after each. Requests are admitted up to `max_queue` at a time (being windowed, waiting or read); beyond that
the answer is 503 with `Retry-After`, so a burst cannot grow memory without bound. One worker thread owns the model
and runs the windows of all waiting requests together, up to `max_batch_tokens` per pass (batching.py); a request's
answer never depends on what it was batched with.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from pathlib import Path
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.exceptions import HTTPException

from ..data.features import WindowTooShort
from ..data.reading import text_problem
from ..data.window_limit import TooManyWindows
from ..reader import Reader
from .batching import ShuttingDown, WindowBatcher
from .guard import Guard
from .schemas import (
    AnswerRequest,
    AnswerResponse,
    ClassifyRequest,
    ClassifyResponse,
    EmbedRequest,
    EmbedResponse,
    ErrorResponse,
    Info,
    PipelineAnswer,
    PipelineRequest,
)
from .settings import ServeSettings

logger = logging.getLogger(__name__)
PAGE = Path(__file__).with_name("static") / "index.html"
ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 413, 415, 422, 503)}
BEARER = HTTPBearer(auto_error=False)
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
# the request fields of what `answer` checks, in /answer and in the pipeline format
ANSWER_FIELDS = {name: name for name in ("question", "document", "window_length", "doc_stride")}
PIPELINE_FIELDS = {"question": "inputs.question", "document": "inputs.context",
                   "window_length": "parameters.max_seq_len", "doc_stride": "parameters.doc_stride"}
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]


class ServeError(Exception):
    def __init__(self, status: int, error: str, detail, headers: dict | None = None):
        super().__init__(detail)
        self.status, self.error, self.detail, self.headers = status, error, detail, headers


def _field(location) -> str:
    return ".".join(str(part) for part in location if part != "body") or "body"


class Metrics:
    """Prometheus metrics of one app (a registry of its own, so two apps in one process never mix counts)."""

    def __init__(self):
        self.registry = CollectorRegistry()
        # route: a path of this app's routes, or "unmatched" (a label per path a client makes up would grow without
        # bound); method: GET / (the page) and POST / (the pipeline format) are two routes of one path (`route_label`)
        self.requests = Counter("longbird_requests", "Requests by route, method and status code",
                                ["route", "method", "code"], registry=self.registry)
        self.latency = Histogram("longbird_request_seconds", "Request latency by route", ["route", "method"],
                                 registry=self.registry, buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        self.queue = Gauge("longbird_queue_depth", "Requests admitted and not yet answered", registry=self.registry)
        self.windows = Counter("longbird_windows", "Windows read", registry=self.registry)
        self.tokens = Counter("longbird_tokens", "Tokens read", registry=self.registry)


def _warm_up(reader: Reader) -> None:
    """Startup of a server with a compiled model: the warm-up documents compile its graphs while the server does not
    yet accept connections, so no client waits for a compilation."""
    started = time.perf_counter()
    records = reader.warm_up()
    logger.info("compiled graphs warmed up in %.1f s (%s)", time.perf_counter() - started,
                ", ".join(f"{r['tokens']} tokens: {r['seconds']:.1f} s" for r in records))


def create_app(reader: Reader, settings: ServeSettings | None = None) -> FastAPI:
    """The application serving `reader` under `settings`."""
    from .. import __version__

    settings = settings or ServeSettings()
    # the schema pages' scripts and styles from the package: /docs works without internet
    app = FastAPIOffline(title="longbird", version=__version__, description="Long-document question answering")
    metrics, admission = Metrics(), threading.Lock()
    state = {"admitted": 0}
    batcher = WindowBatcher(reader, settings.max_batch_tokens)
    app.state.batcher = batcher
    if reader.compiled:  # compile before the first request, not during it (`Reader.warm_up`)
        app.router.on_startup.append(lambda: _warm_up(reader))
    app.router.on_startup.append(batcher.start)
    app.router.on_shutdown.append(batcher.close)

    def authorised(credentials: Credentials) -> None:
        if settings.api_key is None:
            return
        # compared as bytes: the header arrives decoded as Latin-1, and compare_digest refuses non-ASCII str
        if credentials is None or not secrets.compare_digest(credentials.credentials.encode("latin-1"),
                                                             settings.api_key.encode("ascii")):
            raise ServeError(401, "unauthorised", "send the API key as 'Authorization: Bearer KEY'",
                             {"WWW-Authenticate": "Bearer"})

    paths: set[str] = set()  # the paths of this app's routes and mounts (filled at the first request): their labels

    def route_label(scope) -> tuple[str, str]:
        """(route, method) of a request: a route's path, a mount's prefix (the schema pages' files), or "unmatched";
        the method if HTTP names it, else "other" (neither label may grow with what clients make up)."""
        if not paths:
            paths.update(route.path for route in app.routes)
        path, method = scope["path"], scope["method"] if scope["method"] in HTTP_METHODS else "other"
        if path in paths:
            return path, method
        mount = next((prefix for prefix in paths if prefix != "/" and path.startswith(prefix + "/")), None)
        return (mount or "unmatched"), method

    # the guard inside CORS, so that its own refusals and the 500s reach a browser with CORS headers
    app.add_middleware(Guard, settings=settings, metrics=metrics, route_label=route_label)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])

    @app.exception_handler(ServeError)
    async def serve_error(request: Request, error: ServeError):
        return JSONResponse({"error": error.error, "detail": error.detail}, error.status, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError):
        detail = [f"the body is not valid JSON (at character {e['loc'][-1]}: {e['ctx'].get('error', e['msg'])}); "
                  "send one JSON object" if e["type"] == "json_invalid" else f"{_field(e['loc'])}: {e['msg']}"
                  for e in error.errors()]
        return JSONResponse({"error": "invalid request", "detail": detail}, 422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException):
        if error.status_code == 400:  # FastAPI could not read the body at all (e.g. bytes that are not UTF-8)
            return JSONResponse({"error": "malformed request", "detail": "the body could not be read as JSON; send "
                                                                         "a UTF-8 JSON object"}, 400)
        return JSONResponse({"error": error.detail if isinstance(error.detail, str) else "error",
                             "detail": f"{request.method} {request.url.path}"}, error.status_code,
                            headers=getattr(error, "headers", None))

    def read(prepare, alone=None, window_field: str = "window_length"):
        """Admit a request if the queue has room (else 503), window it (`prepare()`), batch its windows with those of
        other requests and rank them; or, with `alone`, run that on the model's thread by itself. ValueError -> 422
        with its message (a window too short for the question: named by `window_field`)."""
        with admission:
            if state["admitted"] >= settings.max_queue:
                raise ServeError(503, "busy", f"{settings.max_queue} requests are already queued; retry later",
                                 {"Retry-After": str(settings.retry_after_seconds)})
            state["admitted"] += 1
            metrics.queue.set(state["admitted"])
        try:
            if alone is not None:
                return batcher.call(alone)
            request = prepare()
            return reader.finish(request, batcher.read(request))
        except TooManyWindows as error:
            raise ServeError(413, "too large", f"{error} (this server's --max-request-windows)") from None
        except ShuttingDown as error:
            raise ServeError(503, "shutting down", str(error),
                             {"Retry-After": str(settings.retry_after_seconds)}) from None
        except WindowTooShort as error:
            raise ServeError(422, "invalid request", f"{window_field}: {error}") from None
        except ValueError as error:
            raise ServeError(422, "invalid request", str(error)) from None
        finally:
            with admission:
                state["admitted"] -= 1
                metrics.queue.set(state["admitted"])

    def check_text(name: str, value: str, limit: int, status: int, field: str | None = None) -> None:
        """`name`: question or document (its limit's option); `field`: the request field that holds it."""
        field = field or name
        if len(value) > limit:
            raise ServeError(status, "too large", f"{field}: {len(value):,} characters; this server reads at most "
                                                  f"{limit:,} (its --max-{name}-chars)")
        problem = text_problem(value, f"send the {name} text")
        if problem is not None:
            raise ServeError(422, "invalid request", f"{field}: {problem}")

    def answer(question, document, is_html, top_k, max_answer_tokens, window_length, doc_stride,
               fields=ANSWER_FIELDS):
        """`fields`: the request's names of question, document, window_length and doc_stride, for error messages."""
        if reader.task != "qa":
            routes = "/classify or /embed" if reader.task == "classification" else "/embed"
            raise ServeError(422, "invalid request", f"this server holds a {reader.task} model: it cannot answer "
                                                     f"questions; use {routes}")
        check_text("question", question, settings.max_question_chars, 422, fields["question"])
        check_text("document", document, settings.max_document_chars, 413, fields["document"])
        window, _, _ = _windows(reader, window_length, fields["window_length"])
        if doc_stride is not None:
            if doc_stride >= window:
                raise ServeError(422, "invalid request", f"{fields['doc_stride']}: {doc_stride} must be below the "
                                                         f"window ({window} tokens); send a smaller "
                                                         f"{fields['doc_stride']}")
        reading = read(lambda: reader.prepare(question, document, is_html=is_html, top_k=top_k,
                                              max_answer_tokens=max_answer_tokens, window_length=window_length,
                                              doc_stride=doc_stride, window_limit=settings.max_request_windows),
                       window_field=fields["window_length"])
        metrics.windows.inc(reading.windows)
        metrics.tokens.inc(reading.tokens)
        return reading

    @app.post("/answer", response_model=AnswerResponse, responses=ERRORS, dependencies=[Depends(authorised)])
    def answer_route(request: AnswerRequest) -> AnswerResponse:
        """The best answers to a question about one document, as `longbird answer --json` gives them."""
        started = time.perf_counter()
        is_html = None if request.format == "auto" else request.format == "html"
        reading = answer(request.question, request.document, is_html, request.top_k, request.max_answer_tokens,
                         request.window_length, request.doc_stride)
        return AnswerResponse(answers=reading.answers, windows=reading.windows, tokens=reading.tokens,
                              window_length=reading.window_length, question_cut=reading.question_cut,
                              model=str(reader.model_dir) if reader.model_dir else None,
                              elapsed_ms=1000 * (time.perf_counter() - started))

    def pipeline(request: PipelineRequest) -> list[PipelineAnswer]:
        """transformers' removed question-answering pipeline, for its existing clients."""
        p = request.parameters
        reading = answer(request.inputs.question, request.inputs.context, None, p.top_k, p.max_answer_len,
                         p.max_seq_len, p.doc_stride, PIPELINE_FIELDS)
        # the scoring rule's value without the lexical prior: below 0 the window's "no answer" beat the span
        found = [a for a in reading.answers
                 if not (p.handle_impossible_answer and a["score"] - a["lexical_prior"] < 0)]
        if not found and p.handle_impossible_answer:
            return [PipelineAnswer(answer="", score=0.0, start=0, end=0)]
        return [PipelineAnswer(answer=a["answer"], score=a["probability"] if a["probability"] is not None
                               else a["score"], start=a["start"], end=a["end"]) for a in found]

    @app.api_route("/", methods=["GET", "HEAD"], response_class=HTMLResponse, include_in_schema=False)
    def page() -> HTMLResponse:
        """The web page: paste or load a document, ask, see the answers highlighted in it (static/index.html)."""
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    for path in ("/", "/predict"):
        app.post(path, response_model=list[PipelineAnswer], responses=ERRORS, dependencies=[Depends(authorised)],
                 summary="Question answering in the transformers pipeline format")(pipeline)

    def exclusive(call):
        """Admit and run `call` on the batcher's thread, alone (classification and embedding are not batched)."""
        return read(lambda: None, call)

    @app.post("/classify", response_model=ClassifyResponse, responses=ERRORS, dependencies=[Depends(authorised)])
    def classify(request: ClassifyRequest) -> ClassifyResponse:
        """Label probabilities of a document (a classification model; windows averaged as `evaluate` does)."""
        started = time.perf_counter()
        check_text("document", request.document, settings.max_document_chars, 413)
        result = exclusive(lambda: reader.classify(request.document, request.window_length, request.stride,
                                                   settings.max_request_windows))
        metrics.windows.inc(result["windows"])
        metrics.tokens.inc(result["tokens"])
        return ClassifyResponse(**result, model=str(reader.model_dir) if reader.model_dir else None,
                                elapsed_ms=1000 * (time.perf_counter() - started))

    @app.post("/embed", response_model=EmbedResponse, responses=ERRORS, dependencies=[Depends(authorised)])
    def embed(request: EmbedRequest) -> EmbedResponse:
        """Vectors of texts from the encoder's last hidden states (any longbird model)."""
        started = time.perf_counter()
        texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs
        for index, text in enumerate(texts):
            check_text("document", text, settings.max_document_chars, 413,
                       "inputs" if isinstance(request.inputs, str) else f"inputs.{index}")
        characters = sum(map(len, texts))
        if characters > settings.max_document_chars:  # together, as their windows share one limit
            raise ServeError(413, "too large", f"inputs: {characters:,} characters in all; this server "
                                               f"embeds at most {settings.max_document_chars:,} per request (its "
                                               "--max-document-chars); send fewer texts at a time")
        result = exclusive(lambda: reader.embed(texts, request.pooling, request.window_length, request.normalize,
                                                settings.max_request_windows))
        metrics.windows.inc(result["windows"])
        metrics.tokens.inc(result["tokens"])
        return EmbedResponse(**result, model=str(reader.model_dir) if reader.model_dir else None,
                             elapsed_ms=1000 * (time.perf_counter() - started))

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    app.head("/health", include_in_schema=False)(health)  # what load balancers and uptime checks send

    @app.get("/info", response_model=Info, responses={401: {"model": ErrorResponse}},
             dependencies=[Depends(authorised)])
    def info() -> Info:
        limits = {"max_document_chars": settings.max_document_chars,
                  "max_question_chars": settings.max_question_chars, "max_queue": settings.max_queue,
                  "max_request_windows": settings.max_request_windows}
        return Info(**reader.info(), version=__version__, limits=limits)

    @app.get("/metrics", responses={401: {"model": ErrorResponse}}, dependencies=[Depends(authorised)])
    def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _windows(reader: Reader, window_length, field: str = "window_length"):
    try:
        return reader.windows_for(window_length)
    except ValueError as error:
        raise ServeError(422, "invalid request", f"{field}: {error}") from None
