"""Shared helpers for ``arli bench``: report files and the JSON-on-last-line convention."""

from __future__ import annotations

import json
import os
import platform
from contextlib import contextmanager
from typing import Any, Iterator

from arli.rl.config import REPORTED_TEST_EPISODES


def rounded(x: float) -> float:
    """A reported number: 4 decimals (a success rate over 200 episodes moves in steps of 0.005)."""
    return round(float(x), 4)


def rounded_interval(ci) -> list[float]:
    """An interval (lo, hi) as reported: [rounded(lo), rounded(hi)]."""
    return [rounded(ci[0]), rounded(ci[1])]


def run_configs(dirs: list[str]) -> list[Any]:
    """The saved config of each `arli finetune` run directory given as ``runs``, loaded before a
    bench does any work, so a missing or unfinished one is named up front as a ``runs`` error."""
    from arli.errors import ConfigError  # noqa: PLC0415
    from arli.runs import load_run_config  # noqa: PLC0415

    out = []
    for run_dir in dirs:
        try:
            out.append(load_run_config(run_dir))
        except ConfigError as exc:
            raise ConfigError(f"runs: {str(exc).removeprefix('run: ')}") from None
    return out


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), or the platform's processor string: a base
    trained here is reproduced by machines with the same CPU kernels, not across them."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version(),
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


def publish(report_dir: str, name: str, payload: dict[str, Any], md_lines: list[str], shown: slice,
            summary: dict[str, Any] | None) -> int:
    """Write the report, print its table (``md_lines[shown]``), then ``summary`` as the
    last-line JSON when given (``--json``). Returns the command's exit code."""
    write_report(report_dir, name, payload, "\n".join(md_lines))
    print("\n".join(md_lines[shown]))
    if summary is not None:
        print_last_line_json(summary)
    return 0


@contextmanager
def figure(path: str, figsize: tuple[float, float] = (6, 4), ncols: int = 1) -> Iterator:
    """A matplotlib figure (headless Agg) whose PNG is written to ``path`` on exit; yields
    its axes (one, or ``ncols`` side by side)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, ncols, figsize=figsize)
    try:
        yield axes
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


@contextmanager
def success_plot(path: str, title: str, xlabel: str, ylabel: str = "success rate",
                 figsize: tuple[float, float] = (6, 4), legend_size: int | None = None) -> Iterator:
    """Axes for a success-rate plot (y in [0, 1]); labels, legend and PNG written on exit."""
    with figure(path, figsize) as ax:
        yield ax
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=legend_size, ncol=2 if legend_size else 1)


REPORTED_TRAINING_SEEDS = 3  # the fewest training seeds a reported cell rests on


def protocol(episodes: int, seeds: int | None) -> dict[str, Any]:
    """Whether a learning report meets the evaluation protocol that reported numbers need
    (``REPORTED_TEST_EPISODES`` test episodes, ``REPORTED_TRAINING_SEEDS`` training seeds).
    A report below it is still written (smoke runs, tests, budget probes) and says so: its
    verdicts are computed the same way but are not results. ``seeds``: the training seeds
    every cell a verdict rests on has (a sweep's partial cells enter none); None where no
    cell is trained (the base alone, the ceiling)."""
    short = ([f"{episodes} test episodes (reported numbers need >= {REPORTED_TEST_EPISODES})"]
             if episodes < REPORTED_TEST_EPISODES else [])
    short += ([f"{seeds} training seed{'s' * (seeds != 1)} (reported cells need >= {REPORTED_TRAINING_SEEDS})"]
              if seeds is not None and seeds < REPORTED_TRAINING_SEEDS else [])
    return {"met": not short, "test_episodes": episodes, "training_seeds": seeds,
            "required": {"test_episodes": REPORTED_TEST_EPISODES, "training_seeds": REPORTED_TRAINING_SEEDS},
            "shortfalls": short}


def protocol_markdown(p: dict[str, Any]) -> str:
    """The report's line on the protocol: empty where it is met."""
    if p["met"]:
        return ""
    return (f"**Below the evaluation protocol** ({'; '.join(p['shortfalls'])}): the numbers and verdicts below "
            "are computed as for a reported result but are not one.\n\n")
