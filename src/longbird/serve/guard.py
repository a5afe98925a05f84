"""The guard around every route of `longbird serve`: content type, body size, 500s and metrics (`Guard`)."""

from __future__ import annotations

import logging
import time

from fastapi.responses import JSONResponse

logger = logging.getLogger("longbird.serve.app")  # the app's log: a failed request's traceback is one of its records
LEFT = object()  # `Guard._body`'s answer for a client that disconnected before its body was in


class Guard:
    """ASGI middleware around every route: 415 for a POST body that is not JSON, 413 for one larger than any
    admissible request (from Content-Length before reading, else while it streams in: a chunked body is read only up
    to the limit), 500 as JSON for anything a route raised (logged with its traceback; the connection stays usable),
    and every answer counted in the metrics with its status and latency, refusals and 500s included (CORS answers
    preflight requests outside it: they are not counted)."""

    def __init__(self, app, settings, metrics, route_label):
        """`settings`: the app's `ServeSettings`; `metrics`: its `Metrics`; `route_label(scope)`: (route, method)."""
        self.app, self.settings, self.metrics, self.route_label = app, settings, metrics, route_label

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), {}
        route, method = self.route_label(scope)

        async def sending(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            refusal = None
            if scope["method"] == "POST":
                refusal, receive = await self._body(scope, receive)
                if refusal is LEFT:
                    return  # the client left while sending its body: no one to answer, nothing to count
            await (refusal or self.app)(scope, receive, sending)
        except Exception:
            if "code" in status:  # the response had begun: nothing more can be said (uvicorn logs it)
                raise
            logger.exception("request %s %s failed", scope["method"], scope["path"])
            await JSONResponse({"error": "internal error", "detail": "the server could not answer; see its log"},
                               500)(scope, receive, sending)
        finally:  # every answer sent, by a route, a refusal or the 500 above (a cancelled request sent none)
            if "code" in status:
                self.metrics.requests.labels(route, method, str(status["code"])).inc()
                self.metrics.latency.labels(route, method).observe(time.perf_counter() - started)

    async def _body(self, scope, receive):
        """(a refusal or None, the `receive` the route reads the body from)."""
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            return JSONResponse({"error": "unsupported media type", "detail": "send JSON with 'Content-Type: "
                                 f"application/json' (got {kind or 'none'})"}, 415), receive
        limit, length = self.settings.max_body_bytes, headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            return self._too_large(f"the body has {int(length):,} bytes"), receive
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # http.disconnect
                return LEFT, receive
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limit:
                return self._too_large(f"the body passed {limit:,} bytes"), receive
        return None, _replay({"type": "http.request", "body": bytes(body), "more_body": False}, receive)

    def _too_large(self, what: str) -> JSONResponse:
        settings = self.settings
        return JSONResponse({"error": "too large", "detail": f"{what}, more than any request this server admits "
                             f"(documents of at most {settings.max_document_chars:,} characters, questions of "
                             f"{settings.max_question_chars:,}: its --max-document-chars and --max-question-chars)"},
                            413)


def _replay(first: dict, receive):
    """A `receive` that gives `first`, then what the connection gives (its disconnect)."""
    pending = [first]

    async def replayed():
        return pending.pop() if pending else await receive()
    return replayed
