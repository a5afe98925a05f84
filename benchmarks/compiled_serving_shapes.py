"""Does a compiled reader still compile after its warm-up? The compiled long reader (bf16, 4,096-token windows)
runs `Reader.warm_up`, then answers prefixes of KorQuAD 1.0 articles of several lengths in sequence; per request the
seconds and the graphs torch.compile made for it (`torch._dynamo` counters). `before`: `compilation.batch_multiple`
patched to None, the reading before batches were padded to the block multiple (issue 27; docs/serve.md).

Usage: python benchmarks/compiled_serving_shapes.py after|before  (needs qa-model/long-untrained: docs/benchmarks.md)
"""
import json
import sys
import time

import torch

import longbird.qa as qa
import longbird.reader as reader_module
from longbird.reader import Reader

if sys.argv[1] == "before":
    qa.batch_multiple = lambda model: None
    reader_module.batch_multiple = lambda model: None
text = " ".join(p["context"] for a in json.load(open("data/korquad/KorQuAD_v1.0_dev.json"))["data"][:6]
                for p in a["paragraphs"])
r = Reader("qa-model/long-untrained", bf16=True, window_length=4096, compile=True)
t = time.perf_counter()
records = r.warm_up()
print(sys.argv[1], "warm-up", f"{time.perf_counter() - t:.1f} s",
      [(x["tokens"], x["windows"], round(x["seconds"], 1)) for x in records], flush=True)
counters = torch._dynamo.utils.counters
for chars in (2500, 5000, 7500, 10000, 6000, 12000, 2500, 9000):
    before = counters["stats"]["unique_graphs"]
    t = time.perf_counter()
    a = r.answer("이 글의 주제는 무엇인가?", text[:chars])
    dt = time.perf_counter() - t
    print(sys.argv[1], chars, "chars", a.tokens, "tokens", a.windows, "windows", f"{dt:.2f} s",
          "new graphs", counters["stats"]["unique_graphs"] - before, flush=True)
