"""Does Inductor's loop merging take the compiled kobigbird with BigBird's per-row plan made on the device?

On an H200 with torch 2.11 it did not (2026-11-28, docs/gpu.md: "InductorError: ValueError: The argument '((-1)) + 1'
is not comparable", from `Scheduler.merge_loops`). Inductor merges loops for GPU nodes only, so on the CPU that step
never runs; this script runs it for every node (a patch of `Scheduler.merge_loops`) and compiles the tiny kobigbird
of that CUDA test (`tests/test_devices.py`: 333 tokens, a sparse row, a shorter sparse row and a full one) with
`LONGBIRD_ROW_PLAN=device`, so the installed torch's loop merging can be checked without a GPU. It prints whether the
merge and the compile went through, and the compiled output's largest difference from eager on real tokens.
Usage: python benchmarks/gpu/merge_loops_on_cpu.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["LONGBIRD_ROW_PLAN"] = "device"
# before torch's import, which reads it: a cached graph would skip the scheduler, and with it the loop merging checked
os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"

import torch  # noqa: E402
import torch._inductor.scheduler as scheduler  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from test_devices import BLOCK, _batch, _converted  # noqa: E402  (the CUDA test's own model and batch)


merged: list[int] = []


def merge_every_node(self) -> None:
    for node in self.nodes:
        if isinstance(node, (scheduler.SchedulerNode, scheduler.FusedSchedulerNode)):
            for part in node.get_nodes():
                if isinstance(part, scheduler.SchedulerNode) and not part.is_template():
                    part.merge_loops()
    merged.append(len(self.nodes))
    print(f"loop merging done for {len(self.nodes)} nodes", flush=True)


def main() -> None:
    scheduler.Scheduler.merge_loops = merge_every_node
    model = _converted("kobigbird", backend="blocked").eval()
    input_ids, attention_mask = _batch(333, "cpu", batch=3)
    attention_mask[2, 2 * BLOCK - 3:] = 0
    real = attention_mask.bool()
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    with torch.no_grad():
        eager = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        ours = compiled(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    if not merged:
        raise SystemExit("Inductor never reached its loop merging: nothing was checked")
    print(f"torch {torch.__version__}: compiled; largest |compiled - eager| on real tokens "
          f"{(ours - eager)[real].abs().max().item():.2e}")


if __name__ == "__main__":
    main()
