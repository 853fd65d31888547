"""``arli`` console script: ``arli <command> [subcommand] key=value ...`` (Hydra overrides).

Flags ``--json`` / ``--help`` are accepted as shorthands for ``json=true`` / usage.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Callable

from omegaconf import OmegaConf

COMMANDS: dict[str, tuple[str, str, str]] = {
    # argv words -> (config name, "module:function", help)
    "finetune": ("finetune", "arli.commands.finetune:main",
                 "ARLI residual RL under simulated latency: base vs finetuned, outputs/<run>/"),
    "eval": ("eval", "arli.commands.eval:main",
             "a finetune run's residual and the base alone on any seed range, per episode, with intervals"),
    "rollout": ("rollout", "arli.commands.rollout:main",
                "scripted-expert chunks under simulated latency: success per delay and strategy"),
    "collect-demos": ("collect_demos", "arli.commands.pretrain:collect_main",
                      "scripted-expert demonstrations into a LeRobotDataset v3"),
    "pretrain": ("pretrain", "arli.commands.pretrain:main",
                 "behaviour-clone the built-in pi0-style flow policy from the demos"),
    "record": ("record", "arli.commands.record:main",
               "intervention episodes (base + residual + intervener) into a crash-safe LeRobotDataset"),
    "serve": ("serve", "arli.commands.pipeline:serve_main",
              "inference server: a base policy behind ZeroMQ (GPU machine)"),
    "learner": ("learner", "arli.commands.pipeline:learner_main",
                "learner service: residual RL for a fleet of actors (workstation)"),
    "actor": ("actor", "arli.commands.pipeline:actor_main",
              "robot runtime: control loop + ARLI residual against serve/learner (robot PC)"),
    "launch sim": ("launch", "arli.commands.pipeline:launch_main",
                   "server + learner + N sim actors as processes on this machine"),
    "keys": ("keys", "arli.commands.pipeline:keys_main", "CurveZMQ key pairs for encrypted transport"),
    "bench base": ("bench_base", "arli.bench.base:main",
                   "base policy: sync vs async naive/blend/rtc at delay_steps 0/2/4/8"),
    "bench latency-sweep": ("bench_latency_sweep", "arli.bench.latency_sweep:main",
                            "success vs delay: base, residual state variants, zero-delay ideal"),
    "bench learner": ("bench_learner", "arli.bench.learner:main",
                      "residual learner updates/s vs a CleanRL-style reference, same run"),
    "bench critic": ("bench_critic", "arli.bench.critic:main",
                     "does a run's critic rank actions? Monte-Carlo Q of candidates from sim state copies"),
    "bench drift": ("bench_drift", "arli.bench.drift:main",
                    "where the select update takes the actor with a run's critic frozen, and how it then succeeds"),
    "bench serve": ("bench_serve", "arli.bench.serve:main",
                    "inference server under 1/2/4 robots: chunks/s and latency, batched vs one at a time"),
    "bench transport": ("bench_transport", "arli.bench.transport:main",
                        "chunk round-trip overhead: our ZeroMQ path vs LeRobot's gRPC path"),
    "bench runtime": ("bench_runtime", "arli.bench.runtime:main",
                      "robot runtime at 20 Hz: loop timing error and residual latency, requests in flight"),
    "bench pipeline": ("bench_pipeline", "arli.bench.pipeline:main",
                       "multi-process sim run (2 actors, 1 learner) vs in-process run, same config"),
    "bench interventions": ("bench_interventions", "arli.bench.interventions:main",
                            "hil finetuning: intervention rate per window of episodes as the residual learns"),
    "bench anchor-start": ("bench_anchor_start", "arli.bench.anchor_start:main",
                           "the anchor-pretrained start's success vs pretraining lr and updates"),
    "bench ceiling": ("bench_ceiling", "arli.bench.ceiling:main",
                      "what the residual's state and bound allow: the projected expert, per delay and bound"),
    "bench runs": ("bench_runs", "arli.bench.runs:main",
                   "finetune runs on several training seeds pooled on their test episodes, with intervals"),
    "bench diagnostics": ("bench_diagnostics", "arli.bench.diagnostics:main",
                          "finished runs' learner statistics (e.g. AWR weight ESS) and speed, per run and group"),
    "bench tune": ("bench_tune", "arli.bench.tune:main",
                   "choose a setting: finetune runs vs the first (reference) on their tune episodes, by code"),
    "bench sim": ("bench_sim", "arli.bench.sim:main",
                  "control steps/s of our default task vs robosuite Lift"),
    "bench record": ("bench_record", "arli.bench.record:main",
                     "recording: save time per episode vs dataset size, open vs reopened dataset"),
}


def config_dir() -> str:
    """The repository's ``configs/`` (override with ARLI_CONFIG_DIR)."""
    env = os.environ.get("ARLI_CONFIG_DIR")
    if env:
        return str(Path(env).resolve())
    return str(Path(__file__).resolve().parents[1] / "configs")


def compose(config_name: str, overrides: list[str]) -> Any:
    """Compose + validate a command's config; raises ConfigError with the field named."""
    from hydra import compose as hydra_compose  # noqa: PLC0415
    from hydra import initialize_config_dir  # noqa: PLC0415
    from hydra.errors import ConfigCompositionException, HydraException  # noqa: PLC0415
    from omegaconf.errors import OmegaConfBaseException  # noqa: PLC0415

    from arli.config import SCHEMAS, ConfigError, register_configs, validate  # noqa: PLC0415

    register_configs()
    schema = SCHEMAS[config_name]
    try:
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            cfg = hydra_compose(config_name=config_name, overrides=overrides)
        added = _unknown_fields(cfg)
        if added:  # '+run.env_stpes=1' adds a key no dataclass reads: it would be ignored silently
            key, owner = added
            raise ConfigError(_unknown_key(key, owner, _added_by(key, overrides)))
        obj = OmegaConf.to_object(cfg)
    except (ConfigCompositionException, HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(_explain(exc.__cause__ or exc, schema, overrides, exc)) from None
    except ConfigError:
        raise
    except ValueError as exc:  # Hydra's own checks on an override (`env=null`, `=3`, a key into a str)
        raise ConfigError(f"{exc}; overrides: {' '.join(overrides)}") from None
    validate(obj)
    return obj


def _unknown_fields(node: Any, prefix: str = "") -> tuple[str, type] | None:
    """The first key under a dataclass node that is not one of its fields (Hydra lets
    ``+key=value`` add one; ``OmegaConf.to_object`` then keeps it and nothing reads it)."""
    import dataclasses  # noqa: PLC0415

    from omegaconf import DictConfig  # noqa: PLC0415

    if not isinstance(node, DictConfig):
        return None
    owner = OmegaConf.get_type(node)
    fields = {f.name for f in dataclasses.fields(owner)} if dataclasses.is_dataclass(owner) else None
    for key in node.keys():
        if fields is not None and key not in fields:
            return f"{prefix}{key}", owner
        found = _unknown_fields(node._get_node(key), f"{prefix}{key}.")
        if found:
            return found
    return None


def _added_by(key: str, overrides: list[str]) -> str | None:
    """The override with '+' (or '++') that added ``key``: it names the key, a key under it, or
    a mapping above it (`+run={env_stpes: 1}`); None where a config file (a recipe, a task's
    group) added it."""
    def names(o: str) -> bool:
        target = o.split("=", 1)[0].lstrip("+")
        return f"{target}.".startswith(f"{key}.") or f"{key}.".startswith(f"{target}.")
    return next((o for o in overrides if o.startswith("+") and names(o)), None)


def _schema_at(schema: type, path: str) -> type | None:
    """The dataclass of the section at ``path`` ("run.learner") under ``schema``; None where no
    dataclass is there."""
    import dataclasses  # noqa: PLC0415
    import typing  # noqa: PLC0415

    owner: Any = schema
    for part in filter(None, path.split(".")):
        owner = typing.get_type_hints(owner).get(part) if dataclasses.is_dataclass(owner) else None
    return owner if dataclasses.is_dataclass(owner) else None


def _unknown_key(full_key: str, owner: Any, asked: str | None = None) -> str:
    """``run.env_stpes: unknown key; did you mean run.env_steps?`` and the section's keys
    (``asked``: the override that added the key with ``+``, as typed)."""
    import dataclasses  # noqa: PLC0415
    import difflib  # noqa: PLC0415

    keys = sorted(f.name for f in dataclasses.fields(owner)) if dataclasses.is_dataclass(owner) else []
    key = full_key.rsplit(".", 1)[-1]
    prefix = full_key[: -len(key)]
    near = difflib.get_close_matches(key, keys, n=1)
    hint = f"; did you mean {prefix}{near[0]}?" if near else ""
    added = " ('+' adds keys only to mappings)" if asked else ""
    where = f"keys of {prefix[:-1]}" if prefix else "top-level keys"
    return f"{asked or full_key}: unknown key{hint}{added}" + (f"\n  valid {where}: {', '.join(keys)}" if keys else "")


def _explain(cause: BaseException, schema: type, overrides: list[str], raised: BaseException | None = None) -> str:
    """One error that names the field (or override) and what it takes: Hydra and OmegaConf
    put the field, the valid options and the failing override in lines or attributes that
    their first line leaves out (``raised``: the exception Hydra raised, whose own lines can
    carry the fix, e.g. "use +recipe=expo")."""
    from hydra.errors import MissingConfigException, OverrideParseException  # noqa: PLC0415
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError  # noqa: PLC0415

    message = str(cause).strip()
    first = (message.splitlines() or [type(cause).__name__])[0]
    full_key = getattr(cause, "full_key", None)
    owner = getattr(cause, "object_type", None)
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and full_key and owner is dict:
        key = str(full_key).rsplit(".", 1)[-1]
        mapping = str(full_key)[: -len(key) - 1]
        # `cameras={front: '0'}` merges into the mapping, and a merge may not add keys either
        whole = next((o for o in overrides if o.split("=", 1)[0] == mapping and "=" in o), None)
        also = f"; or add its keys with '+{whole}'" if whole else ""
        return (f"{full_key}: not a key of the mapping {mapping} yet; add it with "
                f"'+{full_key}=<value>'{also}")
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and full_key:
        return _unknown_key(str(full_key), owner, _added_by(str(full_key), overrides))
    if full_key and (isinstance(cause, ValidationError) or not isinstance(cause, MissingConfigException)):
        return f"{full_key}: {first}"
    if isinstance(cause, MissingConfigException) and "Available options in" in message:
        group = message.split("Available options in '", 1)[1].split("'", 1)[0]
        listed = message.split("Available options in", 1)[1].split("Config search path", 1)[0]
        options = [line.strip() for line in listed.splitlines()[1:]
                   if line.startswith("\t") and not line.strip().endswith("_schema")]
        asked = next((o for o in overrides if o.split("=", 1)[0].lstrip("+~") == group), group)
        return f"{asked}: unknown option for '{group}'; choose from {', '.join(options)}"
    if isinstance(cause, OverrideParseException):
        from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: PLC0415

        parser = OverridesParser.create()
        for override in overrides:
            try:
                parser.parse_overrides([override])
            except OverrideParseException:
                return (f"cannot parse the override {override!r} ({first}): check its brackets and quotes, "
                        "e.g. 'delay_steps=[0,4]' or 'run.seed=3'")
    named = re.search(r"^\s*full_key: (\S+)", message, re.M)
    if named and "ConfigKeyError" in first:  # a config file (a recipe, a task's group) sets a key its section lacks
        key = named.group(1)
        where = re.match(r"In '([^']+)'", first)
        text = _unknown_key(key, _schema_at(schema, key.rsplit(".", 1)[0] if "." in key else ""))
        line, _, rest = text.partition("\n")
        return line + (f" (set in the config file {where.group(1)}.yaml)" if where else "") + (f"\n{rest}" if rest else "")
    fix = next((line.strip() for line in str(raised or "").splitlines() if "use +" in line), "")
    fields = ", ".join(sorted(OmegaConf.structured(schema).keys()))
    return f"{first}" + (f" ({fix})" if fix else "") + f"\n  valid top-level keys: {fields}"


def _resolve(path: str) -> Callable[[Any], int | None]:
    module, func = path.split(":")
    import importlib  # noqa: PLC0415

    return getattr(importlib.import_module(module), func)


def usage() -> str:
    lines = ["usage: arli <command> [key=value ...]", "", "commands:"]
    lines += [f"  {words:<20} {help_}" for words, (_, _, help_) in COMMANDS.items()]
    lines += ["", "example: arli rollout env=pick_cube episodes=20 'delay_steps=[0,4]'"]
    return "\n".join(lines)


def _quiet_warnings() -> None:
    """Warnings a user of the CLI cannot act on (deprecations inside torch, datasets,
    pygame, LeRobot...) are not shown; ARLI's own messages are logs and errors, not warnings."""
    import warnings  # noqa: PLC0415

    for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category)
    warnings.filterwarnings("ignore", message=".*pkg_resources is deprecated.*")
    warnings.filterwarnings("ignore", message="Converting input from bool")


def main(argv: list[str] | None = None) -> int:
    from arli.config import ConfigError  # noqa: PLC0415

    args = list(sys.argv[1:] if argv is None else argv)
    if not os.environ.get("DISPLAY"):  # no screen: MuJoCo renders headless (videos, camera demos)
        os.environ.setdefault("MUJOCO_GL", "egl")
    if argv is None:  # the console script, not a test calling main(): quiet third-party noise
        _quiet_warnings()
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    words = args[0] if args[0] in COMMANDS else " ".join(args[:2])
    if words not in COMMANDS:
        print(f"arli: unknown command {' '.join(args[:2])!r}\n\n{usage()}", file=sys.stderr)
        return 2
    rest = args[len(words.split()):]
    overrides = [("json=true" if a == "--json" else a) for a in rest]
    if "--help" in rest or "-h" in rest:
        name, _, help_ = COMMANDS[words]
        given = [o for o in overrides if o not in ("--help", "-h")]
        try:  # the YAML a run with these overrides would use (config groups composed)
            composed = OmegaConf.to_yaml(OmegaConf.structured(compose(name, given)))
        except ConfigError as exc:
            print(f"arli {words}: invalid config: {exc}", file=sys.stderr)
            return 2
        print(f"arli {words}: {help_}\n\nconfig (defaults{' + your overrides' if given else ''}):\n"
              f"{composed}\noverrides: key=value, nested.key=value, 'list=[a,b]', +new_dict_key=value, "
              f"group=option (e.g. env=pick_cube latency=lognormal); see configs/{name}.yaml")
        return 0
    name, target, _ = COMMANDS[words]
    try:
        cfg = compose(name, overrides)
    except ConfigError as exc:
        print(f"arli {words}: invalid config: {exc}", file=sys.stderr)
        return 2
    from arli.errors import InputError  # noqa: PLC0415
    from robot_drivers.base import RobotFault  # noqa: PLC0415

    try:
        return int(_resolve(target)(cfg) or 0)
    except (InputError, FileNotFoundError, FileExistsError, PermissionError, RobotFault) as exc:
        # what the user can fix: one line; any other exception is a bug and keeps its traceback
        print(f"arli {words}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"arli {words}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
