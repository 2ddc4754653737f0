"""The command line's flags and their rules: argv -> GenerateArgs, every flag that cannot apply refused.

build_parser declares every flag with its help and default (what `-h` shows); parse_args gives a
frozen GenerateArgs that remembers which flags were given; check_flags refuses, in one line each,
a flag given where it cannot apply (a speculative setting without --draft, a DropMatch setting
with another policy, a tree shape without --tree, a one-prompt flag with --batch-size, ...).
Nothing here imports torch at module level: the CLI must be inside run_main within milliseconds.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path

from minispec.cli import Parser, given_flags, nonempty, ranged
from minispec.errors import MinispecError
from minispec.generate.policy_spec import policy_spec

# The CLI imports torch (and everything that imports it) inside the functions that need it, so
# that `python -m minispec.generate` is inside run_main within milliseconds: a Ctrl-C while torch
# loads is then one line, not an import traceback.
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float64": "float64", "fp64": "float64", "auto": "auto"}  # --dtype -> the torch dtype's name
PROG = "minispec.generate"
API_FLAGS = {  # the library's argument names -> the flag that sets each (minispec.cli.in_flags)
    "draft": "--draft", "p_min": "--draft-p-min", "dtype": "--dtype", "device": "--device", "kind": "--kernels",
    "checkpoint": "--ckpt", "draft_length": "--draft-length", "gamma": "--gamma", "tree": "--tree",
    "branching": "--branching", "width": "--tree-width", "keep": "--draft-vocab",
    "batch_size": "--batch-size", "max_new_tokens": "--max-new-tokens",
}
TREE_FLAGS = ("branching", "tree_width")
DRAFT_MODEL_FLAGS = ("draft_kernels", "draft_vocab")  # shape a separate draft model's own weights
SPECULATIVE_FLAGS = ("policy", "gamma", "draft_length", "draft_p_min", "trace", "tree", "vs_plain") + \
    TREE_FLAGS + DRAFT_MODEL_FLAGS
NOT_A_DRAFT_MODEL = ("ngram", "early-exit", "self")  # --draft kinds without weights of their own to shape
NOT_BATCHED = {  # flags that cannot apply to several prompts at once, and why
    "tree": "draft trees are not batched", "branching": "draft trees are not batched",
    "tree_width": "draft trees are not batched", "trace": "prints the steps of one prompt",
    "show": "colours one streamed text, and a batch prints each text whole",
    "color": "colours one streamed text, and a batch prints each text whole",
    "vs_plain": "times one prompt against plain decoding",
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
  --policy block            vLLM: rejection_sample_method="block"
  --policy fly:window_size=W,entropy_threshold=T,entropy_top_k=K
                            vLLM: rejection_sample_method="fly", fly_window_size=W,
                            fly_entropy_threshold=T, fly_entropy_top_k=K
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
    policy: str  # the policy's name; its options from --policy NAME:key=value,... are in policy_options
    gamma: int
    draft_length: str
    draft_p_min: float
    tree: int | None  # nodes per verify pass; None: chains
    branching: tuple[int, ...] | None
    tree_width: int | None
    stats: bool
    show: bool
    color: str
    trace: bool
    draft_kernels: str = "auto"
    draft_vocab: int | None = None
    vs_plain: bool = False
    batch_size: int | None = None  # None: one prompt; N: --prompt-file's lines, N at a time
    policy_options: dict = field(default_factory=dict)  # --policy NAME:key=value,...: constructor options
    # (DropMatch's p may be "auto" or ("auto", LEVEL): calibrated on the prompt, minispec.lab.dropout_calibration)
    given: frozenset[str] = frozenset()  # the flags given on the command line (their dest names)


def build_parser() -> Parser:
    from minispec.model.sampling import MIN_TEMPERATURE

    p = Parser(prog=PROG, description="Generate text with a Llama/Qwen checkpoint, plainly or by draft-then-verify.",
               epilog=EQUIVALENTS)
    p.add_argument("--ckpt", default=None,
                   type=nonempty("--ckpt", "a checkpoint folder, a known name or a hub repo id 'owner/name'"),
                   help="a Hugging Face checkpoint folder, a known name (qwen2.5-coder-1.5b-instruct, ...: "
                        "python -m minispec.weights --list; fetched and converted on first use) or a hub repo id "
                        "'owner/name[@revision]' (fetched into the hub cache; HF_HUB_OFFLINE=1 reads only the cache). "
                        "Default: SmolLM2-135M-Instruct, fetched and converted on first use into weights/ in a source "
                        "checkout, else into MINISPEC_HOME or the user cache folder")
    p.add_argument("--revision", default=None, help="hub revision (branch, tag or commit) of --ckpt")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--prompt", default="What is the capital of France?", help="the prompt text")
    source.add_argument("--prompt-file", type=nonempty("--prompt-file", "a file path, or - for stdin", Path), default=None,
                        help="read the prompt from this file ('-': stdin); the whole file is one prompt, or with "
                             "--batch-size one prompt per line")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--chat", dest="chat", action="store_const", const=True, default=None,
                      help="wrap the prompt in the checkpoint's chat template (the default when it has one)")
    mode.add_argument("--raw", dest="chat", action="store_const", const=False,
                      help="feed the prompt as plain text, without the chat template")
    p.add_argument("--system", default=None,
                   help="system message for chat mode (default: the template's own; '' gives an empty one)")
    p.add_argument("--max-new-tokens", type=ranged(int, "--max-new-tokens", lo=1), default=128,
                   help="the most tokens to generate (prompt + these must fit the model's max_position_embeddings)")
    p.add_argument("--stop", action="append", default=[], metavar="STRING",
                   help="end the generation when the text contains STRING (repeatable); the text ends before it")
    p.add_argument("--temperature", type=temperature, default=0.0,
                   help=f"0 = greedy (argmax, lowest id on ties); else a finite number >= {MIN_TEMPERATURE:g}")
    p.add_argument("--top-k", type=ranged(int, "--top-k", lo=1), default=None, help="sample from the k likeliest tokens")
    p.add_argument("--top-p", type=ranged(float, "--top-p", lo=0, hi=1, lo_open=True), default=None,
                   help="sample from the smallest set of tokens with probability >= p (nucleus)")
    p.add_argument("--seed", type=ranged(int, "--seed", lo=0, hi=2**64, hi_open=True), default=0,
                   help="seeds every random choice (an unsigned 64-bit integer, as torch takes it)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                   help="the weights' and activations' dtype (bf16 = bfloat16, fp32 = float32, fp64 = float64; auto: "
                        "with --kernels auto, nf4 weights for a target of 1e9 or more where its kernel runs (the nf4 "
                        "extra, AVX512-BF16), else bfloat16 where this CPU has a fast 16-bit path, else float32; "
                        "--stats says which)")
    p.add_argument("--device", default="cpu", help="a torch device: cpu, cuda, cuda:1, mps, ...")
    p.add_argument("--kernels", choices=["auto", "fast", "compiled", "fp16", "int8-dynamic", "nf4", "nf4-compiled", "reference"],
                   default="auto",
                   help="auto: fast for each model where it applies (float32, or bfloat16 on a CPU whose oneDNN "
                        "packs it, on the CPU), else reference; "
                        "fast: minispec.kernels' packed, fused weights (CPU only); compiled: the same blocks with "
                        "decoding steps compiled by TorchInductor (CPU only; compiles for minutes on first use, holds "
                        "several copies of the weights); fp16 / int8-dynamic: fbgemm's packed float16 weights / int8 weights "
                        "and activations, half / a quarter of float32's bytes per token (lossy); nf4: 4-bit NormalFloat "
                        "weights, an eighth (lossy; the nf4 extra, AVX512-BF16 CPUs), nf4-compiled its steps compiled; "
                        "reference: model.py "
                        "exactly as written")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (text, tokens, finish_reason, stats) instead of streaming")
    s = p.add_argument_group("speculative decoding")
    s.add_argument("--draft", default=None,
                   type=nonempty("--draft", "a checkpoint folder, a known name, a hub repo id, 'ngram[:N]', "
                                            "'early-exit:N', 'self:bf16' or 'self:int8'"),
                   help="drafter: a checkpoint folder, known name (qwen2.5-coder-0.5b-instruct, ...) or hub repo id, "
                        "'ngram[:N]', 'early-exit:N', 'self:bf16' or 'self:int8' (default: plain decoding)")
    s.add_argument("--policy", default="exact", type=nonempty("--policy", "NAME or NAME:key=value,..."),
                   metavar="NAME[:key=value,...]",
                   help="acceptance policy, with any of its constructor's options after a colon, each typed as the "
                        "constructor takes it (e.g. typical:eps=0.05,delta=0.2, lenience:beta=0.5, "
                        "fly:window_size=4, dropmatch-lazy:p=0.3,paths=5,criterion=majority; a registered policy of "
                        "your own takes its options the same way): exact, sampling, block (Sun et al.'s block "
                        "verification: lossless, never fewer accepted tokens than sampling; vLLM's "
                        "rejection_sample_method 'block'), traversal (its tree form, Weng et al.: lossless on --tree; "
                        "on a chain, block), typical, lenience (sampling against beta times the draft; lossy), fly "
                        "(FLy: exact / sampling plus an entropy gate and a deferred window; lossy; vLLM's 'fly'), "
                        "dropmatch (Algorithm 1 in full), dropmatch-lazy (the same decisions, computing only what each "
                        "needs; p=auto or p=auto:LEVEL calibrates p on the prompt so that all K heads keep the clean "
                        "argmax at LEVEL of its positions, default 0.8), or a registered name")
    s.add_argument("--gamma", type=ranged(int, "--gamma", lo=1), default=5,
                   help="draft length per verify step (with --draft-length heuristic: the most)")
    s.add_argument("--draft-length", type=draft_length_spec, default="fixed",
                   metavar="fixed|heuristic|auto|fallback:TAU",
                   help="fixed: gamma every step; heuristic: +2 after a fully accepted draft, -1 otherwise, "
                        "between 1 and gamma (transformers' schedule); auto: the length (0..gamma) with the most "
                        "expected tokens per second, from this CPU's measured verify and draft costs (once per "
                        "machine) and this prompt's acceptance so far; fallback:TAU: plain decoding for this "
                        "prompt while its recent tokens per step are below TAU, the break-even "
                        "(docs/security.md)")
    s.add_argument("--draft-p-min", type=ranged(float, "--draft-p-min", lo=0, hi=1), default=0.0,
                   help="a model draft stops at the first token whose draft probability is below this (0 = off)")
    s.add_argument("--draft-kernels", choices=["auto", "same", "fast", "int8", "fp16", "int8-dynamic", "nf4", "nf4-compiled",
                            "reference"],
                   default="auto",
                   help="a draft model's kernels: auto = nf4 beside an nf4 target, else the kind whose step is fastest "
                        "on this CPU, measured once; same = the target's (fast for a compiled target, nf4 for "
                        "nf4-compiled); int8: weight-only int8, half a bfloat16 draft's bytes per step; nf4: 4-bit "
                        "weights; fp16 / int8-dynamic: fbgemm's (the cheapest draft step on CPUs without bfloat16 "
                        "arithmetic); any precision drafts: the verify keeps the output the target's")
    s.add_argument("--draft-vocab", type=ranged(int, "--draft-vocab", lo=1), default=None, metavar="N",
                   help="a draft model's LM head over its N most frequent tokens only (ids below N, plus the added "
                        "tokens; FR-Spec): a cheaper draft step, lossless through the target's verify "
                        "(default: the full vocabulary)")
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
                        "batch (minispec.batch.speculative); prompt i (counted from 1, as the headers count) uses seed --seed + i - 1, "
                        "so its text is what it gives alone with that seed; each text is printed under a "
                        "'=== prompt i/n (finish reason) ===' line (default: the file is one prompt)")
    o = p.add_argument_group("output")
    o.add_argument("--stats", action="store_true", help="print tau, acceptance and the time split after the text")
    o.add_argument("--vs-plain", action="store_true",
                   help="then decode the same prompt plainly (no draft, same flags) and report both speeds and the "
                        "speed-up (with --stats: printed; with --json: stats.plain_tokens_per_second, stats.speedup)")
    o.add_argument("--show", action="store_true",
                   help="colour the output: accepted drafts green, corrections red, bonus tokens blue")
    o.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                   help="when --show writes colour codes: auto = only to a terminal (and not with NO_COLOR set)")
    o.add_argument("--trace", action="store_true",
                   help="print every verify step as it happens: the drafts, each row's target choice and "
                        "probability, the decision, the rollback and both caches' lengths (then the text)")
    return p


def temperature(text: str) -> float:
    """--temperature: 0 (greedy) or a finite number >= MIN_TEMPERATURE (minispec.model.sampling says why)."""
    from minispec.model.sampling import MIN_TEMPERATURE

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--temperature = {text!r}; expected a number") from None
    if not (value == 0 or MIN_TEMPERATURE <= value < math.inf):  # also nan
        raise argparse.ArgumentTypeError(f"--temperature = {text}; expected 0 (greedy) or a finite number "
                                         f">= {MIN_TEMPERATURE:g}")
    return value


def draft_length_spec(text: str) -> str:
    """--draft-length: fixed, heuristic, auto or fallback:TAU with TAU a number (its range, 1..gamma+1,
    is checked with --gamma in check_flags)."""
    name, colon, value = text.partition(":")
    if text in ("fixed", "heuristic", "auto"):
        return text
    if name == "fallback":
        try:
            float(value)
            return text
        except ValueError:
            pass
    raise argparse.ArgumentTypeError(f"--draft-length {text!r}: expected fixed, heuristic, auto or fallback:TAU with TAU "
                                     "the tokens per step below which speculation loses (e.g. fallback:1.5)")


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
    ns.policy, ns.policy_options = policy_spec(ns.policy)
    return GenerateArgs(**vars(ns), given=given_flags(parser, argv))


def check_flags(args: GenerateArgs) -> None:
    """A flag given where it cannot apply is a mistake, not something to ignore: say why, in one line."""
    def flag(dest: str) -> str:
        return "--" + dest.replace("_", "-")

    for dest in sorted(args.given):
        if args.draft is None and dest in SPECULATIVE_FLAGS:
            raise MinispecError(f"{flag(dest)}: applies only to speculative decoding; expected a --draft "
                                "(without one, decoding is plain)")
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
        if dest in DRAFT_MODEL_FLAGS and args.draft is not None and args.draft.partition(":")[0] in NOT_A_DRAFT_MODEL:
            raise MinispecError(f"{flag(dest)}: shapes a separate draft model; expected --draft with a checkpoint "
                                f"(not {args.draft}, which has no weights of its own to shape)")
        if dest == "vs_plain" and not (args.stats or args.json):
            raise MinispecError("--vs-plain: reports the speed-up in the stats; expected --stats or --json with it")
        if dest in TREE_FLAGS and args.tree is None:
            raise MinispecError(f"{flag(dest)}: shapes a draft tree; expected --tree N with it")
        if dest in ("trace", "draft_p_min") and args.tree is not None:
            raise MinispecError(f"{flag(dest)}: chain drafts only; expected it without --tree")
        if dest == "draft_length" and args.tree is not None and args.draft_length != "fixed":
            raise MinispecError(f"--draft-length {args.draft_length}: chain drafts only (a tree's depth is --gamma); "
                                "expected it without --tree")
        if dest == "draft_length" and args.draft_length.startswith("fallback:"):
            break_even = float(args.draft_length.partition(":")[2])
            if not 1 <= break_even <= args.gamma + 1:
                raise MinispecError(f"--draft-length {args.draft_length}: the break-even is tokens per step; expected "
                                    f"a number in 1..--gamma + 1 = {args.gamma + 1}")
        if dest == "draft_length" and args.draft_length == "auto" and args.batch_size is not None:
            raise MinispecError("--draft-length auto: prices one prompt's verify pass, not a batch's; expected one of "
                                "--batch-size and --draft-length auto")
        if dest == "batch_size" and args.prompt_file is None:
            raise MinispecError("--batch-size: runs the prompts of a file, one per line; expected --prompt-file FILE "
                                "(or - for stdin) with it")
        if args.batch_size is not None and dest in NOT_BATCHED:
            raise MinispecError(f"{flag(dest)}: {NOT_BATCHED[dest]}; expected one of --batch-size and {flag(dest)}")
    if args.policy_options and args.draft is None:
        raise MinispecError("--policy: options apply only to speculative decoding; expected a --draft "
                            "(without one, decoding is plain)")
    if args.draft is not None and args.policy == "lenience" and args.temperature == 0:
        raise MinispecError("--policy lenience: at --temperature 0 the target gives every draft but its argmax "
                            "probability 0, so lenience is exact match whatever its beta; expected "
                            "--temperature > 0 (or --policy exact)")
    if args.batch_size is not None and isinstance(args.policy_options.get("p"), tuple):
        raise MinispecError(f"--policy {args.policy}:p=auto: calibrates p on one prompt; expected a number for p "
                            "with --batch-size")
    from minispec.checkpoints.tokenizer import check_text

    for text, flag_name in [(args.prompt, "--prompt"), (args.system, "--system"), *((s, "--stop") for s in args.stop)]:
        if text is not None:  # argv bytes that are not UTF-8 arrive as lone surrogates
            check_text(text, flag_name)
