"""User-facing errors.

Every message is one line that names the file, field or flag at fault and what was expected.
The CLIs print `<prog>: error: <message>` for these and exit 2, without a traceback; anything
else that escapes is a bug in minispec and keeps its traceback. (Ctrl-C and a closed stdout are
not errors: minispec.cli.run_main ends those with 130 and one line, and 141 quietly.)
docs/bad_inputs.md shows what each kind of bad input gives.
"""


class MinispecError(Exception):
    """Base for user-facing errors: the message is one line that names the file, field or flag and what was expected.

    With several prompts (minispec.batch.speculative), an error about one of them says which: `prompt_index`
    (from 0; None for an error about no one prompt) and `reason`, the message without the
    `prompts[i]: ` in front, so that a caller can name the prompt its own way (the CLI: a line of
    --prompt-file) without reading the message.
    """

    prompt_index: int | None = None

    @property
    def reason(self) -> str:
        return str(self) if self.prompt_index is None else str(self).partition(": ")[2]

    def for_prompt(self, index: int) -> "MinispecError":
        """The same error (the same class) about prompt `index` of several."""
        error = type(self)(f"prompts[{index}]: {self}")
        error.prompt_index = index
        return error


class ConfigError(MinispecError):
    """A config.json that minispec cannot build a model from."""


class CheckpointError(MinispecError):
    """A checkpoint folder with missing, unexpected or mis-shaped files or tensors."""


class CacheOverflowError(MinispecError):
    """More tokens than the KV cache was created for (e.g. a prompt longer than the cache)."""
