"""One PNG per op: time per mode and compiled temp memory against each sweep's size, one line per provider."""

from __future__ import annotations

import pathlib
from typing import Any

from benchmarks.case import MODES, Op, parse_shape, shape_string

MIB = 2**20


def sweep_rows(op: Op, rows: list[dict[str, Any]]) -> dict[str, tuple[str, list[dict[str, Any]]]]:
    """sweep → (axis, the op's ok bf16 rows at that sweep's shapes on its line: one curve per provider)."""
    from benchmarks.cases import off_line, sweep_line

    found = {}
    for sweep, (axis, points) in op.sweeps.items():
        line = sweep_line(axis, points)
        shapes = {shape_string(p) for p in points if not off_line(axis, p, line)}
        chosen = [r for r in rows if r["op"] == op.name and r["shape"] in shapes and r["dtype"] == "bfloat16"]
        chosen = [r for r in chosen if r["status"] == "ok"]
        if chosen:
            found[sweep] = (axis, chosen)
    return found


def plot_op(op: Op, rows: list[dict[str, Any]], path: pathlib.Path) -> bool:
    """Writes ``path`` for ``op``; returns False (and writes nothing) when no sweep has a measured point."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    sweeps = sweep_rows(op, rows)
    if not sweeps:
        return False
    measured = {r["mode"] for _, chosen in sweeps.values() for r in chosen}
    panels = [*(mode for mode in MODES if mode in measured), *(("memory",) if "full" in measured else ())]
    figure, axes = pyplot.subplots(
        len(panels), len(sweeps), figsize=(5 * len(sweeps), 3 * len(panels)), squeeze=False, sharex="col"
    )
    for column, (sweep, (axis_name, chosen)) in enumerate(sweeps.items()):
        for line, provider in enumerate(sorted({r["provider"] for r in chosen})):
            for row_index, panel in enumerate(panels):
                mode = "full" if panel == "memory" else panel
                mine = [r for r in chosen if (r["provider"], r["mode"]) == (provider, mode)]
                points = sorted(((parse_shape(r["shape"])[axis_name], r) for r in mine), key=lambda point: point[0])
                if panel == "memory":
                    xs = [x for x, r in points if r.get("temp_bytes") is not None]
                    ys = [r["temp_bytes"] / MIB for _, r in points if r.get("temp_bytes") is not None]
                else:
                    xs, ys = [x for x, _ in points], [r["ms"] for _, r in points]
                axes[row_index][column].plot(xs, ys, marker="o", label=provider, color=f"C{line}")
        for row_index, panel in enumerate(panels):
            axis = axes[row_index][column]
            axis.set_xscale("log", base=2)
            if panel == "memory":  # a temp of 0 is common (fused elementwise ops): linear near zero
                axis.set_yscale("symlog", linthresh=1.0)
                axis.set_ylim(bottom=0)
            else:
                axis.set_yscale("log")
            axis.set_ylabel("full-mode temp (MiB)" if panel == "memory" else f"{panel} (ms)")
            axis.grid(True, which="both", alpha=0.3)
            axis.legend(fontsize=8)
        axes[0][column].set_title(f"{op.name}: {sweep} sweep")
        axes[-1][column].set_xlabel(axis_name)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=80)
    pyplot.close(figure)
    return True
