"""How long the command line takes to answer: `longbird --help` (target < 1 s), subcommand help, --version,
`import longbird`, and `longbird bench --smoke` (target < 1 min). Each command runs in a fresh process, median of
several; results go to benchmarks/results/cli_startup.{json,md}.

    python benchmarks/cli_startup.py [--repeats 5] [--skip-smoke]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from longbird.files import write_file_atomically  # noqa: E402

RESULTS = Path(__file__).parent / "results"
TARGETS = {"longbird --help": 1.0, "longbird bench --smoke": 60.0}


def _longbird() -> list[str]:
    script = shutil.which("longbird", path=str(Path(sys.executable).parent)) or shutil.which("longbird")
    return [script] if script else [sys.executable, "-m", "longbird.cli"]


def _seconds(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-smoke", action="store_true", help="Leave out `longbird bench --smoke`")
    args = parser.parse_args()
    longbird = _longbird()
    commands = {
        "longbird --help": [*longbird, "--help"],
        "longbird convert --help": [*longbird, "convert", "--help"],
        "longbird --version": [*longbird, "--version"],
        "python -c 'import longbird'": [sys.executable, "-c", "import longbird"],
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],  # the floor of any command that runs a model
    }
    rows = []
    for label, command in commands.items():
        samples = [_seconds(command) for _ in range(args.repeats)]
        rows.append(dict(command=label, median_seconds=statistics.median(samples), runs=len(samples)))
        print(f"{label}: {rows[-1]['median_seconds']:.2f} s")
    if not args.skip_smoke:
        with tempfile.TemporaryDirectory() as out:
            seconds = _seconds([*longbird, "bench", "--smoke", "--out", out])
        rows.append(dict(command="longbird bench --smoke", median_seconds=seconds, runs=1))
        print(f"longbird bench --smoke: {seconds:.1f} s")
    for row in rows:
        if row["command"] in TARGETS:
            row["target_seconds"] = TARGETS[row["command"]]
            row["met"] = row["median_seconds"] < row["target_seconds"]
    report = dict(command="python benchmarks/cli_startup.py " + " ".join(sys.argv[1:]), python=platform.python_version(),
                  machine=platform.processor() or platform.machine(), rows=rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_file_atomically(RESULTS / "cli_startup.json", json.dumps(report, indent=2) + "\n")
    lines = [f"Command: `{report['command']}` (fresh process per run, median)", "",
             "| command | seconds | target | met |", "|---|---:|---:|---|"]
    lines += [f"| `{row['command']}` | {row['median_seconds']:.2f} | {row.get('target_seconds', '–')} | "
              f"{({True: 'yes', False: 'no'}).get(row.get('met'), '–')} |" for row in rows]
    write_file_atomically(RESULTS / "cli_startup.md", "\n".join(lines) + "\n")
    print("wrote", RESULTS / "cli_startup.json", RESULTS / "cli_startup.md")


if __name__ == "__main__":
    main()
