"""Errors the user can fix. The CLI prints them as one line (no traceback) and exits 2;
anything else is a bug and keeps its traceback."""


class InputError(ValueError):
    """Bad input: a dataset, file, checkpoint or value that is not what the command needs.
    The message names it and says what to do."""


class ConfigError(InputError):
    """A config field has a value that is not allowed; the message names both."""


def require(ok: bool, field_name: str, allowed: str, value) -> None:
    """The one validation idiom: ``ConfigError("<field>: expected <allowed>, got <value>")``."""
    if not ok:
        raise ConfigError(f"{field_name}: expected {allowed}, got {value!r}")
