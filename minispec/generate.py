"""The command line: `python -m minispec.generate --ckpt PATH --prompt TEXT [...]`.

argv -> GenerateArgs (a dataclass) -> load model + tokenizer (+ drafter, policy) ->
speculative.generate -> tokens streamed to the terminal as they are produced, or one JSON
object with --json. With --draft the draft-then-verify loop runs; --show colours each token by
where it came from (an accepted draft, a correction, a bonus token); --stats prints tau,
acceptance and timings; --trace prints every step of the loop as it happens (minispec.trace).
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

from minispec.acceptance.dropmatch_calibrate import DEFAULT_LEVEL
from minispec.cli import Parser, ranged, run_main
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
    kernels: str
    json: bool
    draft: str | None
    policy: str
    gamma: int
    dropout_p: float | str  # a number or "auto"
    agreement: float
    paths: int
    criterion: str
    majority: str
    or_base: bool
    stats: bool
    show: bool
    trace: bool


def build_parser() -> Parser:
    p = Parser(prog=PROG, description="Generate text with a Llama/Qwen3 checkpoint.")
    p.add_argument("--ckpt", type=Path, default=None,
                   help="Hugging Face checkpoint folder (default: weights/smollm2-135m-instruct, fetched on first use)")
    p.add_argument("--prompt", default="What is the capital of France?", help="the prompt text")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the checkpoint's chat template")
    p.add_argument("--system", default=None, help="system message for --chat (default: the template's own)")
    p.add_argument("--max-new-tokens", type=ranged(int, "--max-new-tokens", lo=1), default=128)
    p.add_argument("--temperature", type=ranged(float, "--temperature", lo=0), default=0.0,
                   help="0 = greedy (argmax, lowest id on ties)")
    p.add_argument("--top-k", type=ranged(int, "--top-k", lo=1), default=None)
    p.add_argument("--top-p", type=ranged(float, "--top-p", lo=0, hi=1, lo_open=True), default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--kernels", choices=["fast", "compiled", "reference"], default="fast",
                   help="fast: minispec.kernels' packed, fused weights (float32/bfloat16 on CPU; elsewhere the "
                        "reference path); compiled: the same blocks with decoding steps compiled by TorchInductor "
                        "(compiles for minutes on first use, holds several copies of the weights); "
                        "reference: model.py exactly as written")
    p.add_argument("--json", action="store_true", help="print one JSON object (text, tokens, stats) instead of streaming")
    s = p.add_argument_group("speculative decoding")
    s.add_argument("--draft", default=None,
                   help="drafter: a checkpoint folder, 'ngram[:N]', 'early-exit:N', 'self:bf16' or 'self:int8' (default: plain decoding)")
    s.add_argument("--policy", default="exact",
                   help="acceptance policy: exact, sampling, typical, dropmatch (Algorithm 1 in full), dropmatch-lazy "
                        "(the same decisions, computing only what each needs), or a registered name")
    s.add_argument("--gamma", type=ranged(int, "--gamma", lo=1), default=5, help="draft length per verify step")
    s.add_argument("--dropout-p", type=dropout_p, default=0.3,
                   help="DropMatch: dropout probability on the LM-head input, in [0, 1), or 'auto': the p whose "
                        "measured all-K head agreement with the clean argmax is --agreement, on the target's first "
                        "32 greedy tokens of this prompt (minispec.acceptance.dropmatch_calibrate)")
    s.add_argument("--agreement", type=ranged(float, "--agreement", lo=0, hi=1, lo_open=True), default=DEFAULT_LEVEL,
                   help="with --dropout-p auto: the share of positions where all K heads keep the clean argmax")
    s.add_argument("--paths", type=ranged(int, "--paths", lo=1), default=5, help="DropMatch: number of dropout paths K")
    s.add_argument("--criterion", choices=["js_or_majority", "js", "majority", "naive"], default="js_or_majority")
    s.add_argument("--majority", choices=["strict", "plurality"], default="strict")
    s.add_argument("--no-or-base", dest="or_base", action="store_false",
                   help="DropMatch alone, not OR-ed with its base policy (exact at T=0, sampling at T>0)")
    s.add_argument("--stats", action="store_true", help="print tau, acceptance and the time split after the text")
    s.add_argument("--show", action="store_true",
                   help="colour the output: accepted drafts green, corrections red, bonus tokens blue")
    s.add_argument("--trace", action="store_true",
                   help="print every verify step as it happens: the drafts, each row's target choice and "
                        "probability, the decision, the rollback and both caches' lengths (then the text)")
    return p


def dropout_p(text: str) -> float | str:
    """--dropout-p: 'auto' or a number in [0, 1)."""
    if text == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--dropout-p = {text!r}; expected a number in [0, 1) or 'auto'") from None
    if not 0 <= value < 1:  # also nan
        raise argparse.ArgumentTypeError(f"--dropout-p = {text}; expected 0 <= dropout-p < 1 or 'auto'")
    return value


def parse_args(argv: list[str] | None = None) -> GenerateArgs:
    ns = build_parser().parse_args(argv)
    return GenerateArgs(**vars(ns))


def run(args: GenerateArgs) -> dict:
    from minispec import kernels
    from minispec.checkpoint import load_model
    from minispec.drafters import make_drafter
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
    drafter = make_drafter(args.draft, model)  # before the kernels: a self-draft copies the loaded weights
    prompt_ids = _prompt_ids(args, tokenizer)
    p = args.dropout_p
    if p == "auto" and args.policy in ("dropmatch", "dropmatch-lazy"):  # calibrated on this prompt
        from minispec.acceptance.dropmatch_calibrate import auto_dropout_p

        p = auto_dropout_p(model, prompt_ids, args.paths, args.agreement, eos_token_ids=tokenizer.eos_token_ids)
    kind = args.kernels
    if kind == "fast" and (device.type != "cpu" or model.dtype not in kernels.packed.SUPPORTED_DTYPES):
        kind = "reference"  # the default falls back where packed weights do not apply (float64, not CPU)
    kernels.apply(model, kind, checkpoint=ckpt)
    kernels.apply_drafter(drafter, "fast" if kind == "compiled" else kind)  # a draft model is not compiled
    if kind == "compiled":
        if not args.json:
            print("compiling the decoding steps (minutes on first use; cached on disk) ...", file=sys.stderr)
        kernels.compiled.warm_up(model, verify_rows=(args.gamma + 1,) if drafter is not None else ())
    policy = _policy(args, p)

    printer = None if args.json or args.trace else _Printer(tokenizer, colour=args.show)
    tracer = None
    if args.trace and drafter is not None:
        from minispec.trace import Tracer

        tracer = Tracer(tokenizer, drafter.name, policy.name, out=sys.stderr if args.json else None)  # keep JSON clean
    result = generate(
        model, prompt_ids, max_new_tokens=args.max_new_tokens, draft=drafter, policy=policy, gamma=args.gamma,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
        eos_token_ids=tokenizer.eos_token_ids, on_tokens=None if printer is None else printer.push,
        on_step=tracer,
    )
    text = tokenizer.decode(result.tokens, skip_special_tokens=True)
    if printer is not None:
        printer.finish()
    elif args.trace and not args.json:
        print(text)
    if args.policy in ("dropmatch", "dropmatch-lazy"):
        result.stats["dropout_p"] = p
    return {"text": text, "tokens": result.tokens, "prompt_tokens": len(prompt_ids), "stats": result.stats}


def _prompt_ids(args: GenerateArgs, tokenizer) -> list[int]:
    if not args.chat:
        return tokenizer.encode(args.prompt)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.prompt}
    ]
    return tokenizer.apply_chat_template(messages)


def _policy(args: GenerateArgs, p: float | str):
    from minispec import acceptance

    if args.policy in ("dropmatch", "dropmatch-lazy"):
        return acceptance.get(args.policy, p=p, paths=args.paths, criterion=args.criterion,
                              majority=args.majority, or_base=args.or_base, seed=args.seed)
    try:
        return acceptance.get(args.policy)
    except MinispecError as err:
        raise MinispecError(f"--{err}") from None


GREEN, RED, BLUE, RESET = "\033[32m", "\033[31m", "\033[34m", "\033[0m"


class _Printer:
    """Stream text to the terminal as tokens arrive (only complete UTF-8 characters).

    With colour: accepted draft tokens green; the token the target supplied after a rejection
    (the correction) red; the bonus token after a fully accepted draft blue; tokens of plain
    decoding steps uncoloured.
    """

    def __init__(self, tokenizer, colour: bool) -> None:
        self.stream, self.colour = tokenizer.stream_decoder(skip_special_tokens=True), colour

    def push(self, tokens: list[int], num_accepted: int, num_proposed: int) -> None:
        drafted, last = tokens[:num_accepted], tokens[num_accepted:]
        self._write(self.stream.push(drafted) if drafted else "", GREEN)
        if last:
            target_colour = "" if num_proposed == 0 else (BLUE if num_accepted == num_proposed else RED)
            self._write(self.stream.push(last), target_colour)

    def _write(self, text: str, colour: str) -> None:
        if text:
            sys.stdout.write(f"{colour}{text}{RESET}" if self.colour and colour else text)
            sys.stdout.flush()

    def finish(self) -> None:
        sys.stdout.write(self.stream.flush() + "\n")
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main(PROG, lambda: _report(args, run(args)))


def _report(args: GenerateArgs, out: dict) -> int:
    if args.json:
        print(json.dumps(out))
        return 0
    s = out["stats"]
    print(f"[{s['num_generated_tokens']} tokens, {s['tokens_per_second']:.1f} tok/s, "
          f"prefill {s['num_prompt_tokens']} tokens at {s['prefill_tokens_per_second']:.0f} tok/s]", file=sys.stderr)
    if args.stats:
        print(format_stats(s), file=sys.stderr)
    return 0


def format_stats(s: dict) -> str:
    """A few readable lines of the loop's statistics."""
    if "verify_steps" not in s:
        return f"plain decoding: {s['target_forwards']} target forwards"
    per_pos = " ".join("-" if a is None else f"{a:.2f}" for a in s["per_position_acceptance"])
    lines = [
        f"drafter {s['drafter']}, policy {s['policy']}, gamma {s['gamma']}",
        f"tau {s['tau']:.2f} tokens/step (incl. the correction/bonus token), acceptance rate {s['acceptance_rate']:.2f}",
        f"mean accepted length over the {s['drafted_steps']} steps with drafts (vLLM's, llama.cpp's): "
        + ("-" if s["tau_drafted"] is None else f"{s['tau_drafted']:.2f}"),
        f"per-position acceptance {per_pos}; accepted-length histogram {s['accepted_length_histogram']}",
        f"target forwards {s['target_forwards']}, draft forwards {s['draft_forwards']}",
        f"time: draft {s['draft_seconds']:.2f}s, verify {s['verify_seconds']:.2f}s, policy {s['policy_seconds']:.2f}s, "
        f"total {s['total_seconds']:.2f}s",
    ]
    info = s.get("policy_info", {})
    if "accepted_by_dropmatch_only" in info:
        agree = (f"all K heads agree with the clean argmax at {info['heads_agree'] / info['positions']:.1%} of positions"
                 if info.get("positions") else
                 f"dropout paths computed at {info.get('path_positions', 0) / s['verify_steps']:.2f} positions per step")
        lines.append(f"dropmatch p {s['dropout_p']:.4g}: {agree}; {info['accepted_by_dropmatch_only']} tokens accepted "
                     "only thanks to DropMatch")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
