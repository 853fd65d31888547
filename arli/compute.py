"""Where the torch models of ``arli serve`` and ``arli learner`` run: ``device=auto|cpu|cuda``."""

from __future__ import annotations

from arli.errors import ConfigError

TORCH_DEVICES = ("auto", "cpu", "cuda")


def check_device(name: str, field: str = "device") -> None:
    """ConfigError unless ``name`` is auto, cpu, cuda or cuda:<index>."""
    base, _, index = name.partition(":")
    if base not in TORCH_DEVICES or (index and (base != "cuda" or not index.isdigit())):
        raise ConfigError(f"{field}: expected auto, cpu, cuda or cuda:<index>, got {name!r}")


def resolve_device(name: str, field: str = "device") -> str:
    """``auto`` -> ``cuda`` when torch sees a CUDA device, else ``cpu``; ``cuda`` without one
    is a ConfigError saying so (no silent fall-back to a 50x slower CPU run)."""
    import torch  # noqa: PLC0415 - the actor never imports torch; only the processes that run models

    check_device(name, field)
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"{field}={name}, but torch {torch.__version__} sees no CUDA device "
                              f"(torch.cuda.is_available() is False); use {field}=auto or {field}=cpu, or install a "
                              "CUDA build of torch on a machine with an NVIDIA GPU")
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ConfigError(f"{field}={name}, but torch sees {torch.cuda.device_count()} CUDA device(s)")
    return name


_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3  # glibc's mallopt parameters
_RETAINED: bool | None = None  # None: not tried yet; the outcome of the one try after it


def retain_freed_memory() -> bool:
    """Let glibc's malloc reuse freed blocks instead of returning them to the system.

    By default a block over 128 KiB to 32 MiB (the threshold adapts) is a fresh ``mmap``, and
    unmapped again when freed: each of the learner's per-update activations of a few MiB then
    costs page faults on first touch, about a fifth of a value-gated update on a CPU
    (``arli bench learner``). Raising the mmap threshold to its maximum (32 MiB) and the trim
    threshold keeps those pages in the heap. Process-wide, once; a no-op (False) where the C
    library is not glibc."""
    global _RETAINED
    if _RETAINED is not None:  # tried once: find_library may start a subprocess, not again per learner
        return _RETAINED
    import ctypes  # noqa: PLC0415
    import ctypes.util  # noqa: PLC0415

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl, macOS: no mallopt
        _RETAINED = False
        return False
    _RETAINED = bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20) and mallopt(_M_TRIM_THRESHOLD, 1 << 30)
                     and mallopt(_M_TOP_PAD, 64 << 20))
    return _RETAINED
