"""Serving throughput of `longbird serve`: documents per second and p50/p95 latency for 1, 4 and 16 concurrent clients
on Korean documents of about 512, 2K and 4K tokens.

The server runs in this process (uvicorn on a loopback port, the app of `longbird serve` with its defaults: windows
of concurrent requests batched up to 16,384 tokens); clients are threads with their own HTTP connection, each
sending its share of `--requests` questions in turn. Documents are the visible text of the two KorQuAD 2.1 pages
under data/korquad/ continued with whole KorQuAD 1.0 articles, cut to exactly the token counts; each request asks
that page's question. Windows are the model's
trained window unless `--window-length` is given. fp32 always; bf16 autocast too where the CPU multiplies bf16
natively (elsewhere it is emulated and tens of times slower, so it is left out and said so).
Usage: python benchmarks/serve.py --model DIR [--window-length 512] [--requests 16] [--name serve]
Writes benchmarks/results/NAME.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch
import uvicorn

from longbird.bench.models import cpu_matmul_rates, describe_matmul_rates
from longbird.bench.sweep import cpu_model
from longbird.data.html import visible_text
from longbird.data.korquad import read_korquad_v1_articles, read_korquad_v2
from longbird.files import write_file_atomically
from longbird.malloc import keep_freed_memory
from longbird.precision import native_bf16
from longbird.reader import Reader
from longbird.serve import ServeSettings, create_app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "data" / "korquad" / name for name in ("korquad2.1_dev_00.json", "korquad2.1_train_00.json")]
LENGTHS, CLIENTS = (512, 2048, 4096), (1, 4, 16)


def documents(reader: Reader, lengths=LENGTHS) -> dict[int, list[tuple[str, str]]]:
    """Per target length, (question, text of exactly that many tokens) from each page: the page's visible text (1.2K
    and 2.2K tokens), continued with whole KorQuAD 1.0 articles (real Korean text) where it is shorter."""
    articles = read_korquad_v1_articles(ROOT / "data" / "korquad" / "KorQuAD_v1.0_dev.json")[0]
    more = "\n\n".join(dict.fromkeys(articles["context"][:400]))  # a few whole articles, each once
    cut = {}
    for page in PAGES:
        row = read_korquad_v2(page)[0][0]
        text = visible_text(row["context"]) + "\n\n" + more
        encoded = reader.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        for length in lengths:
            if len(encoded["input_ids"]) < length:
                raise SystemExit(f"only {len(encoded['input_ids'])} tokens of text for {length}-token documents")
            end = encoded["offset_mapping"][length - 1][1]
            cut.setdefault(length, []).append((row["question"], text[:end]))
    return cut


def serve(reader: Reader) -> tuple[str, uvicorn.Server, threading.Thread]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(reader, ServeSettings(max_queue=64)), host="127.0.0.1",
                                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server, thread


def measure(url: str, docs: list[tuple[str, str]], clients: int, requests: int, window: int | None) -> dict:
    total = max(requests, clients)
    share = [total // clients + (1 if i < total % clients else 0) for i in range(clients)]

    def client(index: int) -> list[float]:
        latencies = []
        with httpx.Client(timeout=600) as http:
            for k in range(share[index]):
                question, text = docs[(index + k) % len(docs)]
                started = time.perf_counter()
                response = http.post(url + "/answer", json={"question": question, "document": text,
                                                           "window_length": window})
                response.raise_for_status()
                latencies.append(time.perf_counter() - started)
        return latencies

    began = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        latencies = sorted(x for batch in pool.map(client, range(clients)) for x in batch)
    wall = time.perf_counter() - began
    return {"clients": clients, "requests": total, "seconds": wall, "documents_per_second": total / wall,
            "p50": statistics.median(latencies), "p95": latencies[max(0, round(0.95 * len(latencies)) - 1)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--window-length", type=int, default=None)
    parser.add_argument("--requests", type=int, default=16, help="Requests per cell (at least one per client)")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS), help="Document tokens")
    parser.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS))
    parser.add_argument("--precision", nargs="+", choices=["fp32", "bf16"], default=None,
                        help="Default: fp32, and bf16 where the CPU multiplies bf16")
    parser.add_argument("--compile", action="store_true", help="Serve with the encoder compiled (serve --compile); "
                                                                "one warm-up request per length compiles first")
    parser.add_argument("--name", default="serve")
    args = parser.parse_args()
    malloc = keep_freed_memory()  # as `longbird serve` does (LONGBIRD_MALLOC=system: the C library's defaults)
    precisions = args.precision or ["fp32"] + (["bf16"] if native_bf16("cpu") else [])
    results = {"malloc": malloc, "command": "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
               "machine": f"{cpu_model()}, {os.cpu_count()} CPUs, ATen {torch.backends.cpu.get_cpu_capability()}, "
                          f"torch {torch.__version__}, {torch.get_num_threads()} threads",
               "matmul_tflops": cpu_matmul_rates(), "precisions": precisions, "cells": []}
    for precision in precisions:
        reader = Reader(args.model, bf16=precision == "bf16", compile=args.compile)
        url, server, thread = serve(reader)
        docs = documents(reader, args.lengths)
        results["model"], results["window"] = str(args.model), reader.windows_for(args.window_length)[:2]
        results["compiled"] = args.compile
        for length in args.lengths:
            if args.compile:  # compile outside the timing (the first call of each shape compiles)
                measure(url, docs[length], 1, 1, args.window_length)
            for clients in args.clients:
                cell = {"precision": precision, "tokens": length, **measure(url, docs[length], clients,
                                                                             args.requests, args.window_length)}
                results["cells"].append(cell)
                print(json.dumps(cell), flush=True)
        server.should_exit = True
        thread.join(30)
    write(results, ROOT / "benchmarks" / "results", args.name)


def write(results: dict, out: Path, name: str) -> None:
    window, stride = results["window"]
    lines = [f"# Serving throughput (`longbird serve`, {results['model']})", "",
             f"Command: `{results['command']}`  ",
             f"Machine: {results['machine']}; {describe_matmul_rates(results['matmul_tflops'])}"
             + ("" if "bf16" in results["precisions"] else "; bf16 left out (not native here)")
             + (f"; freed tensor memory (longbird.malloc): {results['malloc']}" if "malloc" in results else ""),
             f"Reading windows of {window} tokens (stride {stride if stride is not None else 'half a window'})"
             + ("; encoder compiled (`--compile`, warmed up per length)" if results.get("compiled") else "") + "; "
             "each client sends its requests in turn; the server batches the windows of concurrent requests.", "",
             "| precision | document tokens | clients | requests | documents / s | p50 s | p95 s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for c in results["cells"]:
        lines.append(f"| {c['precision']} | {c['tokens']} | {c['clients']} | {c['requests']} | "
                     f"{c['documents_per_second']:.2f} | {c['p50']:.2f} | {c['p95']:.2f} |")
    write_file_atomically(out / f"{name}.md", "\n".join(lines) + "\n")
    write_file_atomically(out / f"{name}.json", json.dumps(results, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
