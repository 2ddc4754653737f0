"""The command line: `python -m minispec.generate [--ckpt PATH|REPO_ID] [--prompt TEXT] [...]`.

argv -> GenerateArgs (a dataclass; flags that cannot apply are refused) -> load model + tokenizer
(+ drafter, policy) -> speculative.generate -> tokens streamed to the terminal as they are
produced, or one JSON object with --json. With --draft the draft-then-verify loop runs; --show
colours each token by where it came from (an accepted draft, a correction, a bonus token);
--stats prints tau, acceptance and timings; --trace prints every step of the loop as it happens
(minispec.trace). A checkpoint with a chat template gets the prompt wrapped in it (--raw: not).
Without --ckpt the default checkpoint (SmolLM2-135M-Instruct) is fetched and converted on first
use (minispec.weights.default_checkpoint_dir). User mistakes end in one line on stderr and exit
status 2 (docs/bad_inputs.md lists them). Ctrl-C keeps the text generated so far (with --json: the
object, finish_reason "interrupted") and ends in one line and exit status 130; a closed stdout
(`| head`) ends quietly (minispec.cli.run_main).

With --batch-size N, --prompt-file holds one prompt per line; they run through
minispec.batch.generate_batch N at a time, prompt i seeded with --seed + i, and each prompt's
text is printed under a header once it and every prompt before it are done (with --json: one
object with a result per prompt and the pooled stats).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from minispec.cli import Parser, given_flags, raise_if_interrupted, ranged, run_main
from minispec.errors import MinispecError

if TYPE_CHECKING:
    import torch

# This module imports torch (and everything that imports it) inside the functions that need it, so
# that `python -m minispec.generate` is inside run_main within milliseconds: a Ctrl-C while torch
# loads is then one line, not an import traceback.
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float64": "float64", "fp64": "float64"}  # --dtype -> the torch dtype's name
PROG = "minispec.generate"
DROPMATCH_POLICIES = ("dropmatch", "dropmatch-lazy")
DROPMATCH_FLAGS = ("dropout_p", "agreement", "paths", "criterion", "majority", "or_base")
TREE_FLAGS = ("branching", "tree_width")
SPECULATIVE_FLAGS = ("policy", "gamma", "draft_length", "draft_p_min", "trace", "tree") + DROPMATCH_FLAGS + TREE_FLAGS
NOT_BATCHED = {  # flags that cannot apply to several prompts at once, and why
    "tree": "draft trees are not batched", "branching": "draft trees are not batched",
    "tree_width": "draft trees are not batched", "trace": "prints the steps of one prompt",
    "show": "colours one streamed text, and a batch prints each text whole",
    "color": "colours one streamed text, and a batch prints each text whole",
}

EQUIVALENTS = """\
the same settings in vLLM (speculative_config) / llama.cpp / transformers (generate):
  --gamma N                 num_speculative_tokens=N / --draft-max N / num_assistant_tokens=N
  --draft PATH              model=PATH / -md PATH / assistant_model=the loaded model
  --draft ngram:N           method="ngram", prompt_lookup_max=N / llama-lookup /
                            prompt_lookup_num_tokens=gamma, max_matching_ngram_size=N
  --draft-length heuristic  - / - / num_assistant_tokens_schedule="heuristic"
  --draft-p-min P           - / --draft-p-min P / assistant_confidence_threshold=P
  --policy exact            the lossless verification of each (at temperature 0: greedy)
  --max-new-tokens N        max_tokens=N / -n N / max_new_tokens=N
  --stop S                  stop=[S] / "stop" (server) / stop_strings=[S]
  --temperature, --top-k, --top-p, --seed: the same in all three
  --batch-size N            LLM(max_num_seqs=N) / -np N (llama-server) / pipeline(..., batch_size=N)
                            (vLLM and llama-server refill a finished row's place at once;
                            minispec runs the prompts in consecutive groups of N)
  --tree N --branching K    SGLang's EAGLE trees: --speculative-num-draft-tokens N
                            --speculative-eagle-topk K --speculative-num-steps gamma
--stats: "mean accepted length" = vLLM's mean acceptance length and llama.cpp's accepted
tokens per drafted step (tau_drafted in --json); tau also counts steps that drafted nothing.
"""


@dataclass(frozen=True)
class GenerateArgs:
    ckpt: str | None
    revision: str | None
    prompt: str
    prompt_file: Path | None
    chat: bool | None  # True: --chat, False: --raw, None: chat iff the checkpoint has a chat template
    system: str | None
    max_new_tokens: int
    stop: tuple[str, ...]
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
    draft_length: str
    draft_p_min: float
    dropout_p: float | str  # a number or "auto"
    agreement: float
    paths: int
    criterion: str
    majority: str
    or_base: bool
    tree: int | None  # nodes per verify pass; None: chains
    branching: tuple[int, ...] | None
    tree_width: int | None
    stats: bool
    show: bool
    color: str
    trace: bool
    batch_size: int | None = None  # None: one prompt; N: --prompt-file's lines, N at a time
    given: frozenset[str] = frozenset()  # the flags given on the command line (their dest names)


def build_parser() -> Parser:
    from minispec.acceptance.dropmatch_calibrate import DEFAULT_LEVEL
    from minispec.sampling import MIN_TEMPERATURE

    p = Parser(prog=PROG, description="Generate text with a Llama/Qwen checkpoint, plainly or by draft-then-verify.",
               epilog=EQUIVALENTS)
    p.add_argument("--ckpt", default=None,
                   help="a Hugging Face checkpoint folder or hub repo id 'owner/name[@revision]' (fetched into the "
                        "hub cache; HF_HUB_OFFLINE=1 reads only the cache). Default: SmolLM2-135M-Instruct, fetched "
                        "and converted on first use into weights/ in a source checkout, else into MINISPEC_HOME or "
                        "the user cache folder")
    p.add_argument("--revision", default=None, help="hub revision (branch, tag or commit) of --ckpt")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--prompt", default="What is the capital of France?", help="the prompt text")
    source.add_argument("--prompt-file", type=Path, default=None,
                        help="read the prompt from this file ('-': stdin); the whole file is one prompt, or with "
                             "--batch-size one prompt per line")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--chat", dest="chat", action="store_const", const=True, default=None,
                      help="wrap the prompt in the checkpoint's chat template (the default when it has one)")
    mode.add_argument("--raw", dest="chat", action="store_const", const=False,
                      help="feed the prompt as plain text, without the chat template")
    p.add_argument("--system", default=None,
                   help="system message for chat mode (default: the template's own; '' gives an empty one)")
    p.add_argument("--max-new-tokens", type=ranged(int, "--max-new-tokens", lo=1), default=128)
    p.add_argument("--stop", action="append", default=[], metavar="STRING",
                   help="end the generation when the text contains STRING (repeatable); the text ends before it")
    p.add_argument("--temperature", type=temperature, default=0.0,
                   help=f"0 = greedy (argmax, lowest id on ties); else a finite number >= {MIN_TEMPERATURE:g}")
    p.add_argument("--top-k", type=ranged(int, "--top-k", lo=1), default=None, help="sample from the k likeliest tokens")
    p.add_argument("--top-p", type=ranged(float, "--top-p", lo=0, hi=1, lo_open=True), default=None,
                   help="sample from the smallest set of tokens with probability >= p (nucleus)")
    p.add_argument("--seed", type=ranged(int, "--seed", lo=0, hi=2**64, hi_open=True), default=0,
                   help="seeds every random choice (an unsigned 64-bit integer, as torch takes it)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--device", default="cpu", help="a torch device: cpu, cuda, cuda:1, mps, ...")
    p.add_argument("--kernels", choices=["auto", "fast", "compiled", "reference"], default="auto",
                   help="auto: fast where it applies (a float32/bfloat16 model on the CPU), else reference; "
                        "fast: minispec.kernels' packed, fused weights (CPU only); compiled: the same blocks with "
                        "decoding steps compiled by TorchInductor (CPU only; compiles for minutes on first use, holds "
                        "several copies of the weights); reference: model.py exactly as written")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (text, tokens, finish_reason, stats) instead of streaming")
    s = p.add_argument_group("speculative decoding")
    s.add_argument("--draft", default=None,
                   help="drafter: a checkpoint folder or hub repo id, 'ngram[:N]', 'early-exit:N', 'self:bf16' or "
                        "'self:int8' (default: plain decoding)")
    s.add_argument("--policy", default="exact",
                   help="acceptance policy: exact, sampling, typical, dropmatch (Algorithm 1 in full), dropmatch-lazy "
                        "(the same decisions, computing only what each needs), or a registered name")
    s.add_argument("--gamma", type=ranged(int, "--gamma", lo=1), default=5,
                   help="draft length per verify step (with --draft-length heuristic: the most)")
    s.add_argument("--draft-length", choices=["fixed", "heuristic"], default="fixed",
                   help="fixed: gamma every step; heuristic: +2 after a fully accepted draft, -1 otherwise, "
                        "between 1 and gamma (transformers' schedule)")
    s.add_argument("--draft-p-min", type=ranged(float, "--draft-p-min", lo=0, hi=1), default=0.0,
                   help="a model draft stops at the first token whose draft probability is below this (0 = off)")
    s.add_argument("--dropout-p", type=dropout_p, default=0.3,
                   help="DropMatch: dropout probability on the LM-head input, in [0, 1), or 'auto': the p whose "
                        "measured all-K head agreement with the clean argmax is --agreement, on the target's first "
                        "32 greedy tokens of this prompt (minispec.acceptance.dropmatch_calibrate)")
    s.add_argument("--agreement", type=ranged(float, "--agreement", lo=0, hi=1, lo_open=True), default=DEFAULT_LEVEL,
                   help="with --dropout-p auto: the share of positions where all K heads keep the clean argmax")
    s.add_argument("--paths", type=ranged(int, "--paths", lo=1), default=5, help="DropMatch: number of dropout paths K")
    s.add_argument("--criterion", choices=["js_or_majority", "js", "majority", "naive"], default="js_or_majority",
                   help="DropMatch: the acceptance test")
    s.add_argument("--majority", choices=["strict", "plurality"], default="strict", help="DropMatch: the vote")
    s.add_argument("--no-or-base", dest="or_base", action="store_false",
                   help="DropMatch alone, not OR-ed with its base policy (exact at T=0, sampling at T>0)")
    t = p.add_argument_group("draft trees")
    t.add_argument("--tree", type=ranged(int, "--tree", lo=1), default=None, metavar="N",
                   help="draft a tree of up to N nodes per step instead of a chain, verified in one pass of N+1 rows; "
                        "--gamma is its depth (n-gram and model drafts)")
    t.add_argument("--branching", type=branching, default=None, metavar="K1,K2,...",
                   help="model-draft trees: children per node at depth 1, 2, ... (default 4,2,1); with --tree-width: "
                        "children per expanded node")
    t.add_argument("--tree-width", type=ranged(int, "--tree-width", lo=1), default=None, metavar="W",
                   help="model-draft trees: expand only the W most probable paths per level (EAGLE-2's dynamic "
                        "tree); default: every node (static)")
    b = p.add_argument_group("several prompts")
    b.add_argument("--batch-size", type=ranged(int, "--batch-size", lo=1), default=None, metavar="N",
                   help="run the prompts of --prompt-file, one per line (blank lines skipped), N at a time in one "
                        "batch (minispec.batch); prompt i (from 0) uses seed --seed + i, so its text is what it gives "
                        "alone with that seed; each text is printed under a '=== prompt i/n (finish reason) ===' "
                        "line (default: the file is one prompt)")
    o = p.add_argument_group("output")
    o.add_argument("--stats", action="store_true", help="print tau, acceptance and the time split after the text")
    o.add_argument("--show", action="store_true",
                   help="colour the output: accepted drafts green, corrections red, bonus tokens blue")
    o.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                   help="when --show writes colour codes: auto = only to a terminal (and not with NO_COLOR set)")
    o.add_argument("--trace", action="store_true",
                   help="print every verify step as it happens: the drafts, each row's target choice and "
                        "probability, the decision, the rollback and both caches' lengths (then the text)")
    return p


def temperature(text: str) -> float:
    """--temperature: 0 (greedy) or a finite number >= MIN_TEMPERATURE (minispec.sampling says why)."""
    from minispec.sampling import MIN_TEMPERATURE

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--temperature = {text!r}; expected a number") from None
    if not (value == 0 or MIN_TEMPERATURE <= value < math.inf):  # also nan
        raise argparse.ArgumentTypeError(f"--temperature = {text}; expected 0 (greedy) or a finite number "
                                         f">= {MIN_TEMPERATURE:g}")
    return value


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


def branching(text: str) -> tuple[int, ...]:
    """--branching: comma-separated integers >= 1, e.g. 4,2,1."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"--branching = {text!r}; expected integers >= 1, comma-separated "
                                         "(children per node at depth 1, 2, ...), e.g. 4,2,1")
    return values


def parse_args(argv: list[str] | None = None) -> GenerateArgs:
    parser = build_parser()
    ns = parser.parse_args(argv)
    ns.stop = tuple(ns.stop)
    return GenerateArgs(**vars(ns), given=given_flags(parser, argv))


def check_flags(args: GenerateArgs) -> None:
    """A flag given where it cannot apply is a mistake, not something to ignore: say why, in one line."""
    def flag(dest: str) -> str:
        return "--no-or-base" if dest == "or_base" else "--" + dest.replace("_", "-")

    for dest in sorted(args.given):
        if args.draft is None and dest in SPECULATIVE_FLAGS:
            raise MinispecError(f"{flag(dest)}: applies only to speculative decoding; expected a --draft "
                                "(without one, decoding is plain)")
        if dest in DROPMATCH_FLAGS and args.policy not in DROPMATCH_POLICIES:
            raise MinispecError(f"{flag(dest)}: a DropMatch setting; expected --policy dropmatch or dropmatch-lazy "
                                f"(not {args.policy})")
        if dest in ("top_k", "top_p") and args.temperature == 0:
            raise MinispecError(f"{flag(dest)}: applies only when sampling; expected --temperature > 0 "
                                "(at 0 decoding takes the argmax)")
        if dest in ("show", "color", "stats") and args.json:
            raise MinispecError(f"{flag(dest)}: --json prints one JSON object (with the stats) and no stream; "
                                f"expected one of --json and {flag(dest)}")
        if dest == "color" and not args.show:
            raise MinispecError("--color: says when --show colours the text; expected --show with it")
        if dest == "stop" and "" in args.stop:
            raise MinispecError("--stop '': an empty stop string would stop at once; expected a non-empty STRING")
        if dest == "system" and args.chat is False:
            raise MinispecError("--system: a chat-template message; expected chat mode, not --raw")
        if dest in TREE_FLAGS and args.tree is None:
            raise MinispecError(f"{flag(dest)}: shapes a draft tree; expected --tree N with it")
        if dest in ("trace", "draft_p_min") and args.tree is not None:
            raise MinispecError(f"{flag(dest)}: chain drafts only; expected it without --tree")
        if dest == "draft_length" and args.tree is not None and args.draft_length != "fixed":
            raise MinispecError("--draft-length heuristic: chain drafts only (a tree's depth is --gamma); "
                                "expected it without --tree")
        if dest == "batch_size" and args.prompt_file is None:
            raise MinispecError("--batch-size: runs the prompts of a file, one per line; expected --prompt-file FILE "
                                "(or - for stdin) with it")
        if args.batch_size is not None and dest in NOT_BATCHED:
            raise MinispecError(f"{flag(dest)}: {NOT_BATCHED[dest]}; expected one of --batch-size and {flag(dest)}")
    if "agreement" in args.given and args.dropout_p != "auto":
        raise MinispecError("--agreement: sets how --dropout-p auto calibrates; expected --dropout-p auto")
    if args.batch_size is not None and args.dropout_p == "auto" and args.policy in DROPMATCH_POLICIES:
        raise MinispecError("--dropout-p auto: calibrates p on one prompt; expected a number for --dropout-p with "
                            "--batch-size")
    from minispec.tokenizer import check_text

    for text, flag_name in [(args.prompt, "--prompt"), (args.system, "--system"), *((s, "--stop") for s in args.stop)]:
        if text is not None:  # argv bytes that are not UTF-8 arrive as lone surrogates
            check_text(text, flag_name)


@dataclass
class _Progress:
    """How far a run got: what an interrupted run reports."""

    tokenizer: object = None
    prompt_ids: list[int] | None = None
    tokens: list[int] = field(default_factory=list)  # emitted so far (the loop's on_tokens)
    printer: _Printer | None = None
    stop: StopStrings | None = None

    def on_tokens(self, tokens: list[int], num_accepted: int, num_proposed: int) -> None:
        self.tokens.extend(tokens)
        if self.printer is not None:
            self.printer.push(tokens, num_accepted, num_proposed)

    def text(self) -> str:
        if not self.tokens:
            return ""
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        return text if self.stop is None else self.stop.cut(text)

    def interrupted(self, as_json: bool) -> None:
        """Ctrl-C: print the --json object so far (finish_reason "interrupted"), or end the streamed text."""
        if as_json:
            print(json.dumps({"text": self.text(), "tokens": self.tokens,
                              "prompt_tokens": None if self.prompt_ids is None else len(self.prompt_ids),
                              "finish_reason": "interrupted", "stats": None}))
        elif self.printer is not None:
            self.printer.finish()


def run(args: GenerateArgs) -> dict:
    """Load, generate, return the --json object. On Ctrl-C: end the streamed text (or print the
    --json object so far, finish_reason "interrupted") and let the KeyboardInterrupt go on to
    run_main, which says so in one line and exits 130."""
    progress = _Progress() if args.batch_size is None else _BatchProgress()
    try:
        return _run(args, progress)
    except KeyboardInterrupt:
        progress.interrupted(args.json)
        raise


def _run(args: GenerateArgs, progress: _Progress | _BatchProgress) -> dict:
    from minispec.speculative import generate

    check_flags(args)
    model, tokenizer, drafter, ckpt = _load(args)
    progress.tokenizer = tokenizer
    if args.batch_size is not None:
        return _run_batch(args, progress, model, tokenizer, drafter, ckpt)
    prompt_ids = progress.prompt_ids = _prompt_ids(args, tokenizer)
    p = args.dropout_p
    if p == "auto" and args.policy in DROPMATCH_POLICIES:  # calibrated on this prompt
        from minispec.acceptance.dropmatch_calibrate import auto_dropout_p

        p = auto_dropout_p(model, prompt_ids, args.paths, args.agreement, eos_token_ids=tokenizer.eos_token_ids)
    _apply_kernels(args, model, drafter, ckpt)
    policy = _policy(args, p)
    tree = None
    if args.tree is not None:  # the chain drafter's tree form, on the model the kernels rewrote
        from minispec.tree_speculative import TreeSpec, make_tree_drafter

        tree = TreeSpec(budget=args.tree, branching=args.branching or TreeSpec.branching, width=args.tree_width)
        drafter = make_tree_drafter(drafter, model, tree)

    stop = progress.stop = StopStrings(tokenizer, args.stop) if args.stop else None
    printer = progress.printer = None if args.json or args.trace else _Printer(
        tokenizer, colour=args.show and _use_colour(args.color), stops=args.stop)
    tracer = None
    if args.trace:
        from minispec.trace import Tracer

        tracer = Tracer(tokenizer, drafter.name, policy.name, out=sys.stderr if args.json else None)  # keep JSON clean
    speculative = {} if drafter is None else {"draft_length": args.draft_length, "tree": tree}
    result = generate(
        model, prompt_ids, max_new_tokens=args.max_new_tokens, draft=drafter, policy=policy, gamma=args.gamma,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
        eos_token_ids=tokenizer.eos_token_ids, on_tokens=progress.on_tokens,
        on_step=tracer, stop_when=stop, **speculative,
    )
    text = tokenizer.decode(result.tokens, skip_special_tokens=True)
    if stop is not None:
        text = stop.cut(text)
    if printer is not None:
        printer.finish()
    elif args.trace and not args.json:
        print(text)
    if args.policy in DROPMATCH_POLICIES:
        result.stats["dropout_p"] = p
    return {"text": text, "tokens": result.tokens, "prompt_tokens": len(prompt_ids),
            "finish_reason": result.finish_reason, "stats": result.stats}


def _load(args: GenerateArgs):
    """The target model, its tokenizer, the drafter (None: plain decoding) and the checkpoint folder."""
    import torch

    from minispec.checkpoint import load_model
    from minispec.hub import resolve_checkpoint
    from minispec.tokenizer import load_tokenizer

    device = _device(args.device)
    if args.ckpt is None:
        if args.revision is not None:
            raise MinispecError("--revision: a hub revision of --ckpt; expected a --ckpt repo id with it")
        from minispec.weights import ensure_default_checkpoint

        ckpt = ensure_default_checkpoint()
    else:
        ckpt = resolve_checkpoint(args.ckpt, args.revision, what="--ckpt")

    model = load_model(ckpt, dtype=getattr(torch, DTYPES[args.dtype]), device=device)
    tokenizer = load_tokenizer(ckpt)
    drafter = _drafter(args, model, tokenizer)  # before the kernels: a self-draft copies the loaded weights
    return model, tokenizer, drafter, ckpt


def _apply_kernels(args: GenerateArgs, model, drafter, ckpt: Path) -> None:
    """--kernels: rewrite the loaded model (and a draft model) in place."""
    from minispec import kernels

    kind = args.kernels
    if kind == "auto":  # fast where the packed weights apply (float32/bfloat16 on the CPU), else model.py as written
        kind = "fast" if model.device.type == "cpu" and model.dtype in kernels.packed.SUPPORTED_DTYPES else "reference"
    kernels.apply(model, kind, checkpoint=ckpt)
    kernels.apply_drafter(drafter, "fast" if kind == "compiled" else kind)  # a draft model is not compiled
    if kind == "compiled":
        if not args.json:
            print("compiling the decoding steps (minutes on first use; cached on disk) ...", file=sys.stderr)
        kernels.compiled.warm_up(model, verify_rows=(args.gamma + 1,) if drafter is not None else ())


# ---------------------------------------------------------------- several prompts (--batch-size)


@dataclass
class _BatchProgress:
    """How far a batch got. Prints prompt i's text, under its header, once prompt i and every
    prompt before it have finished (a header names the finish reason, so a text is printed whole);
    what an interrupted batch reports."""

    tokenizer: object = None
    prompts: list[list[int]] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)  # per prompt, emitted so far
    reasons: list[str | None] = field(default_factory=list)  # per prompt, once finished
    printed: int = 0  # prompts printed so far (text mode)
    stop: StopStrings | None = None
    eos: set[int] = field(default_factory=set)
    max_new_tokens: int = 0
    print_text: bool = True

    def start(self, prompts: list[list[int]]) -> None:
        self.prompts, self.tokens, self.reasons = prompts, [[] for _ in prompts], [None] * len(prompts)

    def on_tokens(self, index: int, tokens: list[int], num_accepted: int, num_proposed: int) -> None:
        from minispec.speculative import finish_reason

        self.tokens[index].extend(tokens)
        # the loop's own test, on the same tokens: this prompt ended with its last token
        self.reasons[index] = finish_reason(self.tokens[index], self.eos, self.max_new_tokens, self.stop)
        while self.print_text and self.printed < len(self.prompts) and self.reasons[self.printed] is not None:
            self._print(self.printed)

    def finish(self, reasons: list[str]) -> None:
        """The batch is done: print what is left (with the loop's finish reasons)."""
        self.reasons = list(reasons)
        while self.print_text and self.printed < len(self.prompts):
            self._print(self.printed)

    def _print(self, index: int) -> None:
        print(f"=== prompt {index + 1}/{len(self.prompts)} ({self.reasons[index]}) ===")
        print(self.text(index), flush=True)
        self.printed += 1

    def text(self, index: int) -> str:
        text = self.tokenizer.decode(self.tokens[index], skip_special_tokens=True) if self.tokens[index] else ""
        return text if self.stop is None else self.stop.cut(text)

    def interrupted(self, as_json: bool) -> None:
        """Ctrl-C: the printed texts stay; --json prints the object so far, "interrupted" where unfinished."""
        if as_json:
            results = [{"text": self.text(i), "tokens": self.tokens[i], "prompt_tokens": len(prompt),
                        "finish_reason": self.reasons[i] or "interrupted", "stats": None}
                       for i, prompt in enumerate(self.prompts)]
            print(json.dumps({"results": results, "stats": None}))


def _run_batch(args: GenerateArgs, progress: _BatchProgress, model, tokenizer, drafter, ckpt: Path) -> dict:
    """--batch-size N: every line of --prompt-file a prompt, N decoded together (minispec.batch)."""
    from minispec.batch import generate_batch

    lines = _prompt_lines(args)
    prompts = [_encode(args, tokenizer, text) for _, text in lines]
    seeds = [args.seed + i for i in range(len(prompts))]  # prompt i: what it gives alone with --seed + i
    if seeds[-1] >= 2**64:
        raise MinispecError(f"--seed {args.seed}: prompt i uses --seed + i, which passes 2**64 - 1 at prompt "
                            f"{len(prompts) - 1}; expected --seed <= {2**64 - len(prompts)} for {len(prompts)} prompts")
    progress.start(prompts)
    _apply_kernels(args, model, drafter, ckpt)
    p = args.dropout_p  # a number: auto is refused with --batch-size
    policy = _policy(args, p)
    stop = progress.stop = StopStrings(tokenizer, args.stop) if args.stop else None
    progress.eos, progress.max_new_tokens = set(tokenizer.eos_token_ids), args.max_new_tokens
    progress.print_text = not args.json
    speculative = {} if drafter is None else {"draft_length": args.draft_length}
    try:
        batch = generate_batch(
            model, prompts, max_new_tokens=args.max_new_tokens, draft=drafter, policy=policy, gamma=args.gamma,
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=seeds,
            eos_token_ids=tokenizer.eos_token_ids, on_tokens=progress.on_tokens, stop_when=stop,
            batch_size=args.batch_size, **speculative,
        )
    except MinispecError as err:  # "prompts[i]: ..." (too long for the context): name the file's line
        index, sep, reason = str(err).partition("]: ")
        if not (sep and index.startswith("prompts[") and index[8:].isdigit()):
            raise
        raise type(err)(f"--prompt-file {args.prompt_file} line {lines[int(index[8:])][0]}: {reason}") from None
    progress.finish([result.finish_reason for result in batch])
    stats = dict(batch.stats)  # pooled; names the drafter, policy and gamma when there is a draft
    results = []
    for i, result in enumerate(batch):
        if args.policy in DROPMATCH_POLICIES:
            result.stats["dropout_p"] = p
        text = tokenizer.decode(result.tokens, skip_special_tokens=True)
        results.append({"text": text if stop is None else stop.cut(text), "tokens": result.tokens,
                        "prompt_tokens": len(prompts[i]), "finish_reason": result.finish_reason,
                        "stats": result.stats})
    if args.policy in DROPMATCH_POLICIES:
        stats["dropout_p"] = p
    return {"results": results, "stats": stats}


def _prompt_lines(args: GenerateArgs) -> list[tuple[int, str]]:
    """--prompt-file with --batch-size: (line number from 1, text) of every line that is not blank."""
    lines = [(number, line) for number, line in enumerate(_read_prompt_file(args).splitlines(), start=1)
             if line.strip()]
    if not lines:
        raise MinispecError(f"--prompt-file {args.prompt_file}: no prompts (every line is blank); expected one "
                            "prompt per line with --batch-size")
    return lines


def _device(name: str) -> torch.device:
    """--device as a torch.device that can run a model here: a small computation on it must give a value."""
    import torch

    try:
        device = torch.device(name)
        if device.type == "meta":  # tensors without data: everything "runs", nothing is computed
            raise RuntimeError("meta tensors hold no data")
        torch.ones(2, device=device).add(1).sum().item()
    except Exception as err:  # torch says why in its own words: unknown type, not compiled with it, no such index
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        reason = reason if len(reason) <= 100 else reason[:97] + "..."
        raise MinispecError(f"--device = {name!r}: cannot run a model here ({reason}); expected cpu, or an "
                            "available accelerator such as cuda, cuda:1, mps") from None
    return device


def _drafter(args: GenerateArgs, model, tokenizer):
    """--draft as a Drafter; a draft checkpoint (folder or repo id) must share the target's tokenizer."""
    from minispec.drafters import make_drafter

    from minispec.hub import is_repo_id, resolve_checkpoint

    spec = args.draft
    if spec is not None and (Path(spec).exists() or is_repo_id(spec.partition("@")[0])):  # a draft model
        from minispec.tokenizer import check_same_vocabulary, load_tokenizer

        folder = resolve_checkpoint(spec, what="--draft")
        check_same_vocabulary(load_tokenizer(folder), tokenizer, draft_name=f"--draft {spec}",
                              target_name="the target")
        spec = str(folder)
    return make_drafter(spec, model, p_min=args.draft_p_min)


def _prompt_ids(args: GenerateArgs, tokenizer) -> list[int]:
    """The prompt's token ids: the text from --prompt, --prompt-file or stdin (as UTF-8), encoded by _encode."""
    return _encode(args, tokenizer, args.prompt if args.prompt_file is None else _read_prompt_file(args))


def _read_prompt_file(args: GenerateArgs) -> str:
    """--prompt-file's text, as UTF-8 ('-': stdin)."""
    if str(args.prompt_file) == "-":
        return _read_stdin()
    try:
        return args.prompt_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise MinispecError(f"--prompt-file {args.prompt_file}: cannot be read ({reason}); "
                            "expected a UTF-8 text file") from None


def _encode(args: GenerateArgs, tokenizer, prompt: str) -> list[int]:
    """A prompt's token ids: in the chat template unless --raw (or the checkpoint has none).
    --system "" is an empty system message."""
    chat = bool(tokenizer.chat_template) if args.chat is None else args.chat
    if not chat:
        if args.system is not None:
            raise MinispecError(f"--system: a chat-template message, but {tokenizer.source} has no chat template; "
                                "expected a chat checkpoint")
        return tokenizer.encode(prompt)
    system = [] if args.system is None else [{"role": "system", "content": args.system}]
    return tokenizer.apply_chat_template([*system, {"role": "user", "content": prompt}])


def _read_stdin() -> str:
    """--prompt-file -: stdin's bytes decoded as UTF-8, whatever the locale's encoding and error handler."""
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # a text stream without bytes underneath (a test's StringIO)
        from minispec.tokenizer import check_text

        return check_text(sys.stdin.read(), "--prompt-file - (stdin)")
    try:
        return stream.read().decode("utf-8")
    except UnicodeDecodeError as err:
        raise MinispecError(f"--prompt-file - (stdin): cannot be read ({err}); expected UTF-8 text") from None


def _policy(args: GenerateArgs, p: float | str):
    from minispec import acceptance

    if args.policy in DROPMATCH_POLICIES:
        return acceptance.get(args.policy, p=p, paths=args.paths, criterion=args.criterion,
                              majority=args.majority, or_base=args.or_base)  # masks seeded from --seed by the loop
    try:
        return acceptance.get(args.policy)
    except MinispecError as err:
        raise MinispecError(f"--{err}") from None


def _use_colour(when: str) -> bool:
    """--color: always, never, or auto = stdout is a terminal and NO_COLOR is not set (no-color.org)."""
    if when != "auto":
        return when == "always"
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


class StopStrings:
    """The loop's stop_when for --stop: true once the decoded text contains any of the strings.

    The text is decoded as the output is (special tokens skipped); `cut` ends it before the first
    stop string, as vLLM and llama.cpp's server return it. Called after every token, it decodes
    only the last few tokens: a stop string that ends with the newest token spans at most 4 bytes
    (one byte-level BPE token at least) per character, and every earlier token was checked when it
    was newest.
    """

    def __init__(self, tokenizer, strings: tuple[str, ...]) -> None:
        self.tokenizer, self.strings = tokenizer, strings
        self.window = 4 * max((len(s) for s in strings), default=0) + 1  # tokens decoded per check

    def __call__(self, tokens: list[int]) -> bool:
        text = self.tokenizer.decode(tokens[-self.window:], skip_special_tokens=True)
        return any(s in text for s in self.strings)

    def cut(self, text: str) -> str:
        return text[:min((text.find(s) for s in self.strings if s in text), default=len(text))]


GREEN, RED, BLUE, RESET = "\033[32m", "\033[31m", "\033[34m", "\033[0m"


class _Printer:
    """Stream text to the terminal as tokens arrive (only complete UTF-8 characters).

    With colour: accepted draft tokens green; the token the target supplied after a rejection
    (the correction) red; the bonus token after a fully accepted draft blue; tokens of plain
    decoding steps uncoloured. With stop strings, text that could be the start of one is held
    back until it is known not to be, and nothing from the first stop string on is printed.
    """

    def __init__(self, tokenizer, colour: bool, stops: tuple[str, ...] = ()) -> None:
        self.stream, self.colour, self.stops = tokenizer.stream_decoder(skip_special_tokens=True), colour, stops
        self.pending: list[tuple[str, str]] = []  # (text, colour) held back
        self.stopped = False

    def push(self, tokens: list[int], num_accepted: int, num_proposed: int) -> None:
        drafted, last = tokens[:num_accepted], tokens[num_accepted:]
        self._emit(self.stream.push(drafted) if drafted else "", GREEN)
        if last:
            target_colour = "" if num_proposed == 0 else (BLUE if num_accepted == num_proposed else RED)
            self._emit(self.stream.push(last), target_colour)

    def _emit(self, text: str, colour: str) -> None:
        if self.stopped or not text:
            return
        self.pending.append((text, colour))
        joined = "".join(t for t, _ in self.pending)
        hits = [joined.find(s) for s in self.stops if s in joined]
        if hits:
            self.stopped = True
            self._release(min(hits))
        else:
            self._release(len(joined) - _held_back(joined, self.stops))

    def _release(self, num_chars: int) -> None:
        """Write the first num_chars held-back characters, each piece in its colour; keep the rest."""
        rest: list[tuple[str, str]] = []
        for text, colour in self.pending:
            head, tail = text[:num_chars], text[num_chars:]
            num_chars -= len(head)
            if head:
                sys.stdout.write(f"{colour}{head}{RESET}" if self.colour and colour else head)
            if tail:
                rest.append((tail, colour))
        self.pending = rest if not self.stopped else []
        sys.stdout.flush()

    def finish(self) -> None:
        if not self.stopped:
            self._emit(self.stream.flush(), "")
            self._release(sum(len(t) for t, _ in self.pending))
        sys.stdout.write("\n")
        sys.stdout.flush()


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that is the beginning of a stop string."""
    return max((k for s in stops for k in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:k])),
               default=0)


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        args = parse_args(argv)  # imports torch (through the parser's defaults)
        raise_if_interrupted()  # a Ctrl-C that torch's import swallowed
        return _report(args, run(args))

    return run_main(PROG, body)


def _report(args: GenerateArgs, out: dict) -> int:
    if args.json:
        print(json.dumps(out))
        return 0
    s = out["stats"]
    if args.batch_size is not None:
        print(f"[{s['num_prompts']} prompts, {s['num_generated_tokens']} tokens, {s['tokens_per_second']:.1f} tok/s "
              f"aggregate, prefill {s['num_prompt_tokens']} tokens in {s['prefill_seconds']:.2f}s]", file=sys.stderr)
    else:
        print(f"[{s['num_generated_tokens']} tokens, {s['tokens_per_second']:.1f} tok/s, "
              f"prefill {s['num_prompt_tokens']} tokens at {s['prefill_tokens_per_second']:.0f} tok/s]", file=sys.stderr)
    if args.stats:
        print(format_stats(s), file=sys.stderr)
    return 0


def format_stats(s: dict) -> str:
    """A few readable lines of the loop's statistics (a batch's: pooled over its prompts, plus a line of its own)."""
    batch = "" if "num_prompts" not in s else (
        f"\nbatch: {s['num_prompts']} prompts, batch size {s['batch_size']}, aggregate {s['tokens_per_second']:.1f} "
        f"tok/s, {s['mean_rows_per_pass']:.2f} rows per batched pass (mean)")
    if "verify_steps" not in s:
        return f"plain decoding: {s['target_forwards']} target forwards" + batch
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
    if s.get("tree"):
        lines.insert(1, f"tree: {s['nodes_per_step']:.1f} nodes verified per step (budget {s['budget']}, depth "
                        f"{s['max_depth']}); accepted depth per step {s['accepted_depth_histogram']}")
    info = s.get("policy_info", {})
    if "accepted_by_dropmatch_only" in info:
        agree = (f"all K heads agree with the clean argmax at {info['heads_agree'] / info['positions']:.1%} of positions"
                 if info.get("positions") else
                 f"dropout paths computed at {info.get('path_positions', 0) / s['verify_steps']:.2f} positions per step")
        lines.append(f"dropmatch p {s['dropout_p']:.4g}: {agree}; {info['accepted_by_dropmatch_only']} tokens accepted "
                     "only thanks to DropMatch")
    return "\n".join(lines) + batch


if __name__ == "__main__":
    sys.exit(main())
