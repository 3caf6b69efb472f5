"""Result rows: one dict per measurement, streamed to JSON lines, written out as CSV and JSON at the end.

Kinds of row in the file: timing rows (``kind`` absent), ``"peak"`` rows (a fresh process's peak memory for a
timing row's case, merged into it by :func:`merged`), ``"e2e"`` rows (the training-step benchmark) and
``"attempt"`` markers (a measurement started; dropped by :func:`merged`).
"""

from __future__ import annotations

import csv
import json
import pathlib
from collections.abc import Iterable
from typing import Any

JSONL = "results.jsonl"
KEY = ("op", "provider", "mode", "shape", "dtype")
CSV_COLUMNS = (
    *KEY,
    "status",
    "ms",
    "p20_ms",
    "p80_ms",
    "gb_per_s",
    "tflop_per_s",
    "floor_ms",
    "fraction_of_floor",
    "temp_bytes",
    "arg_bytes",
    "out_bytes",
    "peak_bytes",
    "peak_extra_bytes",
    "peak_status",
    "samples",
    "calls_per_sample",
    "copies",
    "implementation",
    "default_implementation",
    "implementation_note",
    "device",
    "versions",
)


def append(out_dir: pathlib.Path, row: dict[str, Any]) -> None:
    """Appends one row to ``out_dir/results.jsonl`` (written line by line, so a killed run keeps its rows)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / JSONL, "a") as file:
        file.write(json.dumps(row, default=str) + "\n")


def load(path: pathlib.Path) -> list[dict[str, Any]]:
    """Rows from a ``results.jsonl`` or a ``results.json`` written by :func:`write_all`."""
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)["rows"]
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def merged(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Timing rows with their peak rows folded in (later rows win), then the e2e rows, in first-seen order."""
    timing: dict[tuple, dict[str, Any]] = {}
    others: list[dict[str, Any]] = []
    peaks: list[dict[str, Any]] = []
    for row in rows:
        match row.get("kind"):
            case None:
                timing[tuple(row[k] for k in KEY)] = dict(row)
            case "peak":
                peaks.append(row)
            case "attempt":  # run.py's marker of a measurement in flight, superseded by its row
                continue
            case _:
                others.append(row)
    for peak in peaks:
        target = timing.get(tuple(peak[k] for k in KEY))
        if target is not None:
            target.update({k: v for k, v in peak.items() if k not in (*KEY, "kind")})
    return [*timing.values(), *others]


def write_all(out_dir: pathlib.Path, rows: list[dict[str, Any]], environment: dict[str, Any]) -> None:
    """Writes ``results.csv`` (timing rows) and ``results.json`` (environment and every row) to ``out_dir``."""
    timing = [row for row in rows if row.get("kind") is None]
    with open(out_dir / "results.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in timing:
            writer.writerow({k: json.dumps(v) if isinstance(v, dict) else v for k, v in row.items()})
    (out_dir / "results.json").write_text(json.dumps({"environment": environment, "rows": rows}, indent=1, default=str))
