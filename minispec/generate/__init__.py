"""The command line: `python -m minispec.generate [--ckpt PATH|REPO_ID] [--prompt TEXT] [...]`.

argv -> GenerateArgs (flags.py: a dataclass; flags that cannot apply are refused) -> load model +
tokenizer (+ drafter, policy) -> minispec.decode.generate (run.py) -> tokens streamed to the
terminal as they are produced, or one JSON object with --json (printing.py). With --draft the draft-then-verify loop runs; --show
colours each token by where it came from (an accepted draft, a correction, a bonus token);
--stats prints tau, acceptance and timings; --trace prints every step of the loop as it happens
(minispec.generate.trace). A checkpoint with a chat template gets the prompt wrapped in it (--raw: not).
Without --ckpt the default checkpoint (SmolLM2-135M-Instruct) is fetched and converted on first
use (minispec.checkpoints.fetch.default_checkpoint_dir). User mistakes end in one line on stderr and exit
status 2 (docs/bad_inputs.md lists them). Ctrl-C keeps the text generated so far (with --json: the
object, finish_reason "interrupted") and ends in one line and exit status 130; a closed stdout
(`| head`) ends quietly (minispec.cli.run_main).

With --batch-size N, --prompt-file holds one prompt per line; they run through
minispec.batch.speculative.generate_batch N at a time, prompt i seeded with --seed + i, and each prompt's
text is printed under a header once it and every prompt before it are done (with --json: one
object with a result per prompt and the pooled stats).

    flags.py      every flag with its help and default, and the rules on which flags go together
    policy_spec.py  --policy NAME[:key=value,...]: the policy and its typed options
    prompts.py    the prompt text or file, read and encoded (chat template unless --raw)
    run.py        loading, then one prompt or several; what Ctrl-C still reports
    printing.py   streaming (stop strings, colour), a batch's texts, the stats lines
"""

from __future__ import annotations

from minispec.cli import raise_if_interrupted, run_main
from minispec.generate.flags import API_FLAGS, PROG, GenerateArgs, build_parser, check_flags, parse_args

__all__ = ["main", "parse_args", "build_parser", "check_flags", "GenerateArgs"]


def main(argv: list[str] | None = None) -> int:
    """The command line: parse, run, print; the exit status (0, 2 for a user mistake, 130 for Ctrl-C)."""
    from minispec.generate.printing import report
    from minispec.generate.run import run

    def body() -> int:
        args = parse_args(argv)  # imports torch (through the parser's defaults)
        raise_if_interrupted()  # a Ctrl-C that torch's import swallowed
        return report(args, run(args))

    return run_main(PROG, body, API_FLAGS)
