"""Shared helpers for ``arli bench``: report files and the JSON-on-last-line convention."""

from __future__ import annotations

import json
import os
import platform
from typing import Any


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
