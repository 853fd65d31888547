"""Which code a result ran: the content digest of every repository module a process imported
(``loaded_sources``), checked later against the files (``sources_unchanged``). A latency-sweep
cell's row and an ``arli finetune`` summary record them, so a cached cell or a committed run is
known to have run the code that is there now, or is not reused as if it had."""

from __future__ import annotations

import hashlib
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CODE_PACKAGES = ("arli/", "sim_envs/", "robot_drivers/")
# cannot change a cell's result: the CLI, reports, and the command schemas (``arli/config.py``:
# the values it gives reach a cell only through the settings the fingerprint hashes)
REPORT_ONLY_SOURCES = ("arli/cli.py", "arli/commands/", "arli/bench/", "arli/config.py")


def _file_digest(rel: str) -> str | None:
    try:
        with open(os.path.join(REPO, rel), "rb") as fh:
            return hashlib.sha1(fh.read()).hexdigest()[:16]
    except OSError:
        return None


_FIRST_SEEN: dict[str, str] = {}  # per process: a module's digest when it was first seen loaded
CHANGED_WHILE_RUNNING = "changed-while-running"  # never a file's digest: the row is stale


def _code_files() -> list[str]:
    return sorted(os.path.relpath(os.path.join(root, name), REPO).replace(os.sep, "/")
                  for package in CODE_PACKAGES for root, _, files in os.walk(os.path.join(REPO, package))
                  for name in files if name.endswith(".py"))


# every code file's digest when this module is first imported: the sweep and `arli finetune`
# import it before the code their results run (a forked sweep worker inherits the snapshot)
_AT_START: dict[str, str | None] = {rel: _file_digest(rel) for rel in _code_files()}


def loaded_sources() -> dict[str, str]:
    """{repo-relative path: content digest} of every repository module this process has
    imported (minus the CLI and report code): after a cell or run, exactly the code its result
    can depend on (a worker's earlier cells can only add files, never hide one). A module
    first imported during a cell is read from disk then, so a file edited since the snapshot
    cannot be told apart from the one that ran: it is recorded as ``CHANGED_WHILE_RUNNING``
    and its rows run again next time."""
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not path or not os.path.abspath(path).startswith(REPO + os.sep):
            continue
        rel = os.path.relpath(os.path.abspath(path), REPO).replace(os.sep, "/")
        if rel.startswith(CODE_PACKAGES) and not rel.startswith(REPORT_ONLY_SOURCES) and rel not in _FIRST_SEEN:
            now = _file_digest(rel)
            _FIRST_SEEN[rel] = now if now is not None and _AT_START.get(rel, now) == now else CHANGED_WHILE_RUNNING
    return dict(sorted(_FIRST_SEEN.items()))


def sources_unchanged(sources: dict[str, str] | None) -> bool:
    """True when every file a cached cell (or a run) ran still has the content it had (a row
    without the list, from an older sweep, is stale)."""
    return bool(sources) and all(digest is not None and _file_digest(rel) == digest for rel, digest in sources.items()
                                 if not rel.startswith(REPORT_ONLY_SOURCES))
