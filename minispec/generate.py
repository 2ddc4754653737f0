"""The command line: `python -m minispec.generate --ckpt PATH --prompt TEXT [...]`.

argv -> GenerateArgs (a dataclass) -> load model + tokenizer -> speculative.generate ->
tokens streamed to the terminal as they are produced, or one JSON object with --json.
Without --ckpt the default checkpoint (SmolLM2-135M-Instruct) is fetched and converted into
weights/ on first use. User mistakes end in one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from minispec.errors import MinispecError

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float64": torch.float64, "fp64": torch.float64}
PROG = "minispec.generate"


@dataclass(frozen=True)
class GenerateArgs:
    ckpt: Path | None
    prompt: str
    chat: bool
    system: str | None
    max_new_tokens: int
    temperature: float
    top_k: int | None
    top_p: float | None
    seed: int
    dtype: str
    device: str
    json: bool


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        self.exit(2, f"{PROG}: error: {message}\n")


def _ranged(kind, name: str, lo=None, hi=None, lo_open=False, hi_open=False):
    """An argparse type that checks a numeric range and names the flag when it is violated."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} = {text!r}; expected {'an integer' if kind is int else 'a number'}")
        too_low = lo is not None and (value <= lo if lo_open else value < lo)
        too_high = hi is not None and (value >= hi if hi_open else value > hi)
        if too_low or too_high or value != value:  # value != value catches nan
            lo_s = "" if lo is None else f"{lo} {'<' if lo_open else '<='} "
            hi_s = "" if hi is None else f" {'<' if hi_open else '<='} {hi}"
            raise argparse.ArgumentTypeError(f"{name} = {text}; expected {lo_s}{name.lstrip('-')}{hi_s}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=f"python -m {PROG}", description="Generate text with a Llama/Qwen3 checkpoint.")
    p.add_argument("--ckpt", type=Path, default=None,
                   help="Hugging Face checkpoint folder (default: weights/smollm2-135m-instruct, fetched on first use)")
    p.add_argument("--prompt", default="What is the capital of France?", help="the prompt text")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the checkpoint's chat template")
    p.add_argument("--system", default=None, help="system message for --chat (default: the template's own)")
    p.add_argument("--max-new-tokens", type=_ranged(int, "--max-new-tokens", lo=1), default=128)
    p.add_argument("--temperature", type=_ranged(float, "--temperature", lo=0), default=0.0,
                   help="0 = greedy (argmax, lowest id on ties)")
    p.add_argument("--top-k", type=_ranged(int, "--top-k", lo=1), default=None)
    p.add_argument("--top-p", type=_ranged(float, "--top-p", lo=0, hi=1, lo_open=True), default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true", help="print one JSON object (text, tokens, stats) instead of streaming")
    return p


def parse_args(argv: list[str] | None = None) -> GenerateArgs:
    ns = build_parser().parse_args(argv)
    return GenerateArgs(**vars(ns))


def run(args: GenerateArgs) -> dict:
    from minispec.checkpoint import load_model
    from minispec.speculative import generate
    from minispec.tokenizer import load_tokenizer

    ckpt = args.ckpt
    if ckpt is None:
        from minispec.weights import ensure_default_checkpoint

        ckpt = ensure_default_checkpoint()
    try:
        device = torch.device(args.device)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as err:
        raise MinispecError(f"--device = {args.device!r}: not available here ({str(err).splitlines()[0]})") from None

    model = load_model(ckpt, dtype=DTYPES[args.dtype], device=device)
    tokenizer = load_tokenizer(ckpt)
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.prompt}
        ]
        prompt_ids = tokenizer.apply_chat_template(messages)
    else:
        prompt_ids = tokenizer.encode(args.prompt)

    stream = None if args.json else _Streamer(tokenizer)
    result = generate(
        model, prompt_ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        top_k=args.top_k, top_p=args.top_p, seed=args.seed, eos_token_ids=tokenizer.eos_token_ids,
        on_tokens=None if stream is None else stream.push,
    )
    text = tokenizer.decode(result.tokens, skip_special_tokens=True)
    if stream is not None:
        stream.finish()
    return {"text": text, "tokens": result.tokens, "prompt_tokens": len(prompt_ids), "stats": result.stats}


class _Streamer:
    """Print text as tokens arrive: decode everything so far and print the new suffix, holding
    back while it ends in an incomplete UTF-8 sequence (decoded as U+FFFD)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.ids, self.printed = tokenizer, [], 0

    def push(self, new_tokens: list[int], num_drafted: int) -> None:
        self.ids.extend(new_tokens)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            sys.stdout.write(text[self.printed:])
            sys.stdout.flush()
            self.printed = len(text)

    def finish(self) -> None:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        sys.stdout.write(text[self.printed:] + "\n")
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        out = run(args)
    except MinispecError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out))
    else:
        s = out["stats"]
        print(f"[{s['num_generated_tokens']} tokens, {s['tokens_per_second']:.1f} tok/s, "
              f"prefill {s['num_prompt_tokens']} tokens at {s['prefill_tokens_per_second']:.0f} tok/s]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
