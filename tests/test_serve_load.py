"""Load and faults against a real `longbird serve` process on a loopback port (bounded: 32 concurrent clients, a tiny
model, 96 valid requests of three lengths and 96 bad ones): every valid request is answered (none lost, no 5xx) with
the answer it gets alone, the malformed, oversized and misspelt requests mixed in get their 4xx, latency percentiles
and throughput are printed; a server killed with SIGKILL mid-load is started again and serves."""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from longbird.data.korquad import read_korquad_v2
from longbird.reader import Reader
from test_qa_cli import PAGES, tiny_qa, tiny_source  # noqa: F401  (fixtures)

CLIENTS, ROUNDS = 32, 1


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(model: Path, port: int, log: Path) -> subprocess.Popen:
    stream = open(log, "ab")  # noqa: SIM115 (the process writes to it until it ends)
    process = subprocess.Popen([sys.executable, "-m", "longbird.cli", "serve", "--model", str(model), "--port",
                                str(port), "--max-queue", "64", "--max-document-chars", "200000", "--threads", "2"],
                               stdout=stream, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 180
    while time.time() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise AssertionError(f"the server did not start: {log.read_text()[-2000:]}")


def requests_of(document: str, question: str) -> list[tuple[str, dict | bytes, int]]:
    """(kind, body, expected status) of one client's mixed requests: valid ones of three lengths, then the bad."""
    mixed = []
    for length in (1_500, 4_000, 10_000):
        mixed.append(("valid", {"question": question, "document": document[:length], "top_k": 2}, 200))
    mixed.append(("malformed", b'{"question": "q", "document": ', 422))
    mixed.append(("oversized", {"question": question, "document": "가" * 200_001}, 413))
    mixed.append(("unknown field", {"question": question, "document": "text", "stride": 3}, 422))
    return mixed


@pytest.fixture(scope="module")
def page():
    row = read_korquad_v2(PAGES[1])[0][0]
    return row["context"], row["question"]


def test_load_with_faults_mixed_in_then_a_killed_server_restarts(tiny_qa, page, tmp_path):
    document, question = page
    reader = Reader(tiny_qa)
    plan = requests_of(document, question)
    alone = {json.dumps(body): [(a["start"], a["end"], a["answer"]) for a in reader.answer(
        body["question"], body["document"], top_k=2).answers] for kind, body, _ in plan if kind == "valid"}
    port, log = free_port(), tmp_path / "server.log"
    server = start(tiny_qa, port, log)
    url = f"http://127.0.0.1:{port}/answer"
    try:
        def client(index: int) -> list[tuple[str, int, float, dict | None, str]]:
            results = []
            with httpx.Client(timeout=300) as http:
                for _ in range(ROUNDS):
                    for kind, body, _ in plan[index % 3:] + plan[:index % 3]:  # clients interleave differently
                        started = time.perf_counter()
                        if isinstance(body, bytes):
                            response = http.post(url, content=body, headers={"content-type": "application/json"})
                        else:
                            response = http.post(url, json=body)
                        results.append((kind, response.status_code, time.perf_counter() - started,
                                         response.json(), json.dumps(body) if kind == "valid" else ""))
            return results

        began = time.perf_counter()
        with ThreadPoolExecutor(CLIENTS) as pool:
            results = [r for batch in pool.map(client, range(CLIENTS)) for r in batch]
        wall = time.perf_counter() - began
        expected = {kind: status for kind, _, status in plan}
        assert len(results) == CLIENTS * ROUNDS * len(plan)  # none lost
        assert all(status < 500 for _, status, _, _, _ in results), "a 5xx under load"
        for kind, status, _, body, key in results:
            assert status == expected[kind], (kind, status, body)
            assert set(body) >= ({"answers"} if kind == "valid" else {"error", "detail"})
            if kind == "valid":
                assert [(a["start"], a["end"], a["answer"]) for a in body["answers"]] == alone[key]
        latencies = sorted(seconds for kind, _, seconds, _, _ in results if kind == "valid")
        valid = len(latencies)
        p50, p95 = statistics.median(latencies), latencies[int(0.95 * (valid - 1))]
        print(f"\n{CLIENTS} clients x {ROUNDS} rounds: {valid} answers in {wall:.1f} s ({valid / wall:.1f}/s), "
              f"p50 {p50:.2f} s, p95 {p95:.2f} s; {len(results) - valid} bad requests refused")
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert f'longbird_requests_total{{code="200",method="POST",route="/answer"}} {float(valid)}' in metrics

        # SIGKILL while requests are in flight, then start again on the same port
        with ThreadPoolExecutor(8) as pool:
            flying = [pool.submit(httpx.post, url, json=plan[2][1], timeout=60) for _ in range(8)]
            time.sleep(0.5)
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(30)
            for future in flying:
                try:
                    future.result()
                except httpx.HTTPError:
                    pass  # a request cut by the kill: the client sees a transport error, not a wrong answer
        server = start(tiny_qa, port, log)
        again = httpx.post(url, json=plan[0][1], timeout=120)
        assert again.status_code == 200
        assert [(a["start"], a["end"], a["answer"]) for a in again.json()["answers"]] == alone[json.dumps(plan[0][1])]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(30)
