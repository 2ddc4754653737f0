"""User-facing errors.

Every message is one line that names the file, field or flag at fault and what was expected.
The CLIs print `<prog>: error: <message>` for these and exit 2, without a traceback; anything
else that escapes is a bug in minispec and keeps its traceback. (Ctrl-C and a closed stdout are
not errors: minispec.cli.run_main ends those with 130 and one line, and 141 quietly.)
docs/bad_inputs.md shows what each kind of bad input gives.
"""


class MinispecError(Exception):
    """Base for user-facing errors: the message is one line that names the file, field or flag and what was expected."""


class ConfigError(MinispecError):
    """A config.json that minispec cannot build a model from."""


class CheckpointError(MinispecError):
    """A checkpoint folder with missing, unexpected or mis-shaped files or tensors."""


class CacheOverflowError(MinispecError):
    """More tokens than the KV cache was created for (e.g. a prompt longer than the cache)."""
