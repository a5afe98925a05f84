"""`longbird serve`: the HTTP server (longbird.serve) over one QA model loaded once."""

import errno
import os
import socket
import sys
from pathlib import Path
from typing import Annotated

import typer

from .common import console, resolve_device
from .options import LEXICAL_RADIUS, LEXICAL_WEIGHT, Compile, Device, LexicalRadius, LexicalWeight

ServedModel = Annotated[Path, typer.Option(help="A fine-tuned longbird QA or classification directory, or any "
                                                  "longbird model (for /embed)")]
Host = Annotated[str, typer.Option(help="Address to bind (127.0.0.1: this machine only; 0.0.0.0: every interface)")]
Port = Annotated[int, typer.Option(min=1, max=65535, help="TCP port")]
Bf16 = Annotated[bool, typer.Option("--bf16", help="bf16 autocast, the encoder's Linear weights stored in bf16 "
                                                   "(fast only where the CPU or GPU multiplies bf16)")]
ServeWindow = Annotated[int | None, typer.Option(min=1, help="Reading window of requests that name none (default: "
                                                             "the window the model was fine-tuned at)")]
Threads = Annotated[int | None, typer.Option(min=1, help="CPU threads of the model (default: torch's choice)")]
MaxDocumentChars = Annotated[int, typer.Option(min=1, help="Longest document in characters (413 beyond)")]
MaxQuestionChars = Annotated[int, typer.Option(min=1, help="Longest question in characters (422 beyond)")]
MaxBatchTokens = Annotated[int, typer.Option(min=1, help="Padded tokens per model pass over the windows of "
                                                         "concurrent requests")]
MaxRequestWindows = Annotated[int, typer.Option(min=1, help="Windows one request may make (its document at its "
                                                            "stride; 413 beyond, checked before any is built)")]
MaxQueue = Annotated[int, typer.Option(min=1, help="Requests admitted at once; beyond: 503 with Retry-After")]
ApiKey = Annotated[str | None, typer.Option(envvar="LONGBIRD_API_KEY", help="Require 'Authorization: Bearer KEY' "
                                                                         "(or set LONGBIRD_API_KEY)")]
CorsOrigin = Annotated[list[str] | None, typer.Option(help="Allow browser calls from this origin (repeatable; "
                                                          "default: CORS off)")]


def serve(model: ServedModel, host: Host = "127.0.0.1", port: Port = 8000, device: Device = "auto",
          bf16: Bf16 = False, threads: Threads = None, window_length: ServeWindow = None,
          max_document_chars: MaxDocumentChars = 1_000_000, max_question_chars: MaxQuestionChars = 1_000,
          max_queue: MaxQueue = 32, max_request_windows: MaxRequestWindows = 4_096,
          max_batch_tokens: MaxBatchTokens = 16_384, api_key: ApiKey = None, cors_origin: CorsOrigin = None,
          compile: Compile = False, lexical_weight: LexicalWeight = LEXICAL_WEIGHT,
          lexical_radius: LexicalRadius = LEXICAL_RADIUS):
    """Serve long documents over HTTP: POST /answer, the pipeline format at POST / and /predict, /classify, /embed,
    the web page at GET /, /health, /info and /metrics; the schema at /docs."""
    from ..serve.settings import ServeSettings

    # checked before torch and the model load (seconds): a bad --api-key, a taken port, a wrong --model fail at once
    settings = ServeSettings(max_document_chars=max_document_chars, max_question_chars=max_question_chars,
                             max_queue=max_queue, max_batch_tokens=max_batch_tokens,
                             max_request_windows=max_request_windows, api_key=api_key,
                             cors_origins=list(cors_origin or []))
    listening = checked_start(host, port, model)
    import torch
    import uvicorn

    from ..reader import Reader
    from ..serve.app import create_app

    if threads is not None:
        torch.set_num_threads(threads)
    reader = Reader(model, resolve_device(device), bf16=bf16, window_length=window_length, compile=compile,
                    lexical_weight=lexical_weight, lexical_radius=lexical_radius)
    # one line whatever the terminal's width (a log collector reads it as one record)
    console.print(f"serving {model} on http://{host}:{port} (schema: http://{host}:{port}/docs)", markup=False,
                  soft_wrap=True)
    run(uvicorn, create_app(reader, settings), host, port, listening)


def run(uvicorn, app, host: str, port: int, listening: list[socket.socket]) -> None:
    """Serve `app` until a signal. A second Ctrl-C (uvicorn's force quit) answers every request still queued or being
    read 503 at once (`WindowBatcher.cancel`: uvicorn alone stopped waiting for connections, yet its shutdown read
    every queued request first) and leaves without waiting for the model's thread, which may be mid-pass (or letting
    the interpreter abort it in C++)."""
    server = _server(uvicorn, app.state.batcher)(uvicorn.Config(app, host=host, port=port, log_level="info"))
    server.run(sockets=listening)
    if server.force_exit:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)


def _server(uvicorn, batcher):
    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            super().handle_exit(sig, frame)
            if self.force_exit:  # uvicorn's force quit: a second SIGINT (a second SIGTERM stays graceful)
                batcher.cancel()

    return Server


def checked_start(host: str, port: int, model: Path) -> list[socket.socket]:
    """The sockets `bound_sockets` binds, once --model is known to be a model directory: before torch and the model
    load, a taken port or a wrong --model fails in a second, in one line."""
    from ..sources import resolve_model_directory

    listening = bound_sockets(host, port)
    try:
        resolve_model_directory(model)
    except Exception:
        for bound in listening:
            bound.close()
        raise
    return listening


def bound_sockets(host: str, port: int) -> list[socket.socket]:
    """TCP sockets bound to every address of `host` (as uvicorn binds them: `localhost` is often ::1 and 127.0.0.1,
    an empty host every interface), for uvicorn to listen on; ValueError naming the fix where one cannot be bound."""
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as error:
        raise ValueError(f"--host {host!r} is not an address this machine can listen on ({error}); use 127.0.0.1 "
                         f"(this machine only) or 0.0.0.0 (every interface)") from None
    bound: list[socket.socket] = []
    for family, kind, protocol, _, address in dict.fromkeys(addresses):
        listening = socket.socket(family, kind, protocol)
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a restart reuses the port
        if family == socket.AF_INET6:  # as asyncio does: IPv6 sockets take IPv6 only, IPv4 has its own
            listening.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            listening.bind(address)
        except OSError as error:
            for other in (*bound, listening):
                other.close()
            if error.errno == errno.EADDRNOTAVAIL:
                raise ValueError(f"--host {host} is not an address of this machine ({error.strerror}); use "
                                 f"127.0.0.1 (this machine only) or 0.0.0.0 (every interface)") from None
            raise ValueError(f"cannot listen on {host}:{port}: {error.strerror}; choose another --port, or stop what "
                             f"listens there") from None
        bound.append(listening)
    return bound
