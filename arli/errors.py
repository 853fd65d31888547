"""Errors the user can fix. The CLI prints them as one line (no traceback) and exits 2;
anything else is a bug and keeps its traceback."""


class InputError(ValueError):
    """Bad input: a dataset, file, checkpoint or value that is not what the command needs.
    The message names it and says what to do."""
