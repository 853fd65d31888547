"""Shared helpers for ``arli bench``: report files and the JSON-on-last-line convention."""

from __future__ import annotations

import json
import os
import platform
from contextlib import contextmanager
from typing import Any, Iterator


def machine_info() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "machine": platform.machine()}


def write_report(report_dir: str, name: str, payload: dict[str, Any], markdown: str) -> tuple[str, str]:
    """Write ``<name>.json`` and ``<name>.md`` under ``report_dir``; returns their paths."""
    os.makedirs(report_dir, exist_ok=True)
    json_path = os.path.join(report_dir, f"{name}.json")
    md_path = os.path.join(report_dir, f"{name}.md")
    with open(json_path, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=1)
    with open(md_path, "w", encoding="utf-8") as fh:
        fh.write(markdown)
    return json_path, md_path


def print_last_line_json(payload: dict[str, Any]) -> None:
    """Benchmarks end with one JSON object on the last stdout line (for scripts)."""
    print(json.dumps(payload), flush=True)


@contextmanager
def success_plot(path: str, title: str, xlabel: str, ylabel: str = "success rate",
                 figsize: tuple[float, float] = (6, 4), legend_size: int | None = None) -> Iterator:
    """Axes for a success-rate plot (y in [0, 1]); labels, legend and PNG written on exit."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=figsize)
    try:
        yield ax
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=legend_size, ncol=2 if legend_size else 1)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
