"""Batching under load: the windows of concurrent requests run together, up to a token budget.

Each request is windowed in its own thread (`Reader.prepare`: tokenizing runs beside the model), then handed to one
worker thread that owns the model. The worker takes every request waiting, sorts their windows by length (less
padding), cuts them into batches of at most `max_batch_tokens` padded tokens (at least one window each; like
text-embeddings-inference's `--max-batch-tokens`) of windows at least three quarters as long as their batch's longest
(`data.batching.plan_batches`), runs each batch once (`qa.run_windows`) and decodes every window
with its own request's settings (`qa.decode_outputs`), then wakes the requests, which rank their own windows
(`Reader.finish`). A request's answer never depends on what it was batched with: the per-row plan makes each row's
outputs independent of the other rows and of the padding (tests/test_batch_independence.py), each window decodes
only its own request's k best starts, and a request ranks only its own windows (tests/test_serve.py compares
batched answers with unbatched ones through HTTP).
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field

from ..data.batching import plan_batches
from ..qa import WindowCandidates, decode_outputs, run_windows
from ..reader import Reader, Request

logger = logging.getLogger(__name__)


class ShuttingDown(RuntimeError):
    """The server stops without reading what is still queued (a second Ctrl-C: `WindowBatcher.cancel`)."""


@dataclass
class _Job:
    request: Request | None  # None: a call run alone (`WindowBatcher.call`)
    done: threading.Event = field(default_factory=threading.Event)
    windows: list[WindowCandidates | None] = field(default_factory=list)
    error: BaseException | None = None
    call: object = None
    result: object = None


class WindowBatcher:
    """The one thread that runs the model for a server (module docstring). `read(request)` blocks until the
    request's windows are decoded; `stats` counts batches, windows and the most requests one pass served."""

    def __init__(self, reader: Reader, max_batch_tokens: int = 16_384):
        if max_batch_tokens < 1:
            raise ValueError(f"--max-batch-tokens must be at least 1; got {max_batch_tokens}")
        self.reader, self.max_batch_tokens = reader, max_batch_tokens
        self.jobs: queue.Queue[_Job | None] = queue.Queue()  # bounded by the server's admission (--max-queue)
        self.stats = {"batches": 0, "windows": 0, "most_requests_in_a_pass": 0}
        self.reading: list[_Job] = []  # the requests of the pass being read
        self.cancelled = False
        self.thread: threading.Thread | None = None
        self._starting = threading.Lock()

    def start(self) -> None:
        """Start the worker unless it runs (`read` calls it too: an app whose lifespan ended, e.g. a test client
        closed, and that is called again gets a new worker instead of a queue nobody reads)."""
        with self._starting:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._work, name="longbird-batcher", daemon=True)
                self.thread.start()

    def _refuse_after_cancel(self) -> None:
        if self.cancelled:  # windowed after the second Ctrl-C: not read, and no worker started again
            raise ShuttingDown("the server is shutting down; retry on another instance or later")

    def read(self, request: Request) -> list[WindowCandidates]:
        self._refuse_after_cancel()
        self.start()
        job = _Job(request, windows=[None] * len(request.features))
        self.jobs.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.windows

    def call(self, function):
        """Run `function()` on the model's thread between passes (the model is never used by two threads at once)
        and return its result."""
        self._refuse_after_cancel()
        self.start()
        job = _Job(None, call=function)
        self.jobs.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def cancel(self) -> None:
        """Stop now (a second Ctrl-C): the requests still queued and those of the pass being read get ShuttingDown
        at once (the first signal's shutdown reads them all, which took seconds to minutes with long documents
        queued); the worker, a daemon thread, stops after its pass or with the process."""
        self.cancelled = True
        queued = []
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                queued.append(job)
        # the pass being read too: its requests are answered now, and the process exits without waiting for it
        for job in [*queued, *self.reading]:
            if not job.done.is_set():
                job.error = ShuttingDown("the server is shutting down; retry on another instance or later")
                job.done.set()
        self.jobs.put(None)

    def close(self) -> None:
        """Stop the worker after the requests already queued (the app's shutdown)."""
        with self._starting:
            if self.thread is not None and self.thread.is_alive() and not self.cancelled:
                self.jobs.put(None)
                self.thread.join(timeout=60)

    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            jobs = [job]
            while True:  # every request already waiting joins this pass
                try:
                    more = self.jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self.jobs.put(None)  # stop after this pass
                    break
                jobs.append(more)
            self.reading = jobs  # what `cancel` answers at once, the calls run alone included
            for alone in [pending for pending in jobs if pending.request is None]:
                try:
                    alone.result = alone.call()
                except BaseException as error:  # the caller gets it; the worker keeps serving
                    alone.error = error
                alone.done.set()
            jobs = [pending for pending in jobs if pending.request is not None]
            try:
                self._run(jobs)
            except BaseException as error:  # the requests get the error; the worker keeps serving
                logger.exception("a pass over %d requests failed", len(jobs))
                for pending in jobs:
                    pending.error = pending.error or error
            for pending in jobs:
                pending.done.set()
            self.reading = []

    def _run(self, jobs: list[_Job]) -> None:
        if not jobs:
            return
        windows = [(job, index) for job in jobs for index in range(len(job.request.features))]
        lengths = [len(job.request.features[index].input_ids) for job, index in windows]
        self.stats["most_requests_in_a_pass"] = max(self.stats["most_requests_in_a_pass"], len(jobs))
        model = self.reader.model
        # linked windows (linked_windows.py) read every window of their request together and no other request's
        batches = ([[i for i, (owner, _) in enumerate(windows) if owner is job] for job in jobs]
                   if getattr(model.config, "linked_windows", False)
                   else plan_batches(lengths, max_tokens=self.max_batch_tokens))
        for batch in batches:
            members = [windows[i] for i in batch if windows[i][0].error is None]
            owners = list({id(job): job for job, _ in members}.values())
            try:
                self._read(members)
            except Exception as error:
                if len(owners) == 1:  # its own fault: its error, and its other windows are not read
                    owners[0].error = error
                    continue
                # one request's fault must not fail the others: this batch is read again per request
                logger.exception("a batch of %d requests failed; reading each of them alone", len(owners))
                for owner in owners:
                    try:
                        self._read([member for member in members if member[0] is owner])
                    except Exception as own:
                        owner.error = own

    def _read(self, members: list[tuple[_Job, int]]) -> None:
        """Run and decode the windows `members` (job, window index), each with its own request's settings."""
        if not members:
            return
        model = self.reader.model
        features = [job.request.features[index] for job, index in members]
        with self.reader._precision():
            outputs = run_windows(model, features, max(job.request.decode_top_k for job, _ in members),
                                  max_answer_tokens=max(job.request.max_answer_tokens
                                                        or model.config.qa_max_answer_tokens for job, _ in members))
        for (job, index), feature, output in zip(members, features, outputs):
            job.windows[index] = decode_outputs(model, feature, output, job.request.decode_top_k,
                                                job.request.max_answer_tokens)
        self.stats["batches"] += 1
        self.stats["windows"] += len(members)
