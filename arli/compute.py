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
