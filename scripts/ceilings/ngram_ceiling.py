"""How far can prompt lookup go on the benchmark's prompts? tau of n-gram drafters, offline.

    python scripts/ceilings/ngram_ceiling.py [--dtype float32] [--prompts 4] [--gammas 3,5,8]

At temperature 0 with exact match, a draft token is accepted iff it equals the target's greedy
token there, so one plain greedy run per prompt (the fast kernels, up to --max-new-tokens or
eos, as bench_speed.py's speculative section) decides every step of every n-gram variant offline:

    step:  draft = lookup(prompt + emitted, g);  n = longest prefix of draft equal to greedy's;
           emit n + 1 tokens (the accepted drafts and the target's own next token)
    tau  = tokens emitted / steps

Speculation's speed-up over plain decoding is at most tau: a verify pass costs at least a decode
step. The variants: minispec's NgramDrafter (most recent match of the last n tokens, n from
max down to min) for several (min, max); "longest" (the earlier position whose preceding tokens
match the context's suffix for the longest stretch); "earliest" (the first match in the context,
as transformers' prompt lookup takes it). Prints one table row per set x gamma: median tau over
the prompts for each variant. Prompts: the first --prompts of Spec-Bench's summarization and
RAG categories, as bench_speed.py uses.
Exact in float32; in bfloat16 a verify pass may round differently from a decode step at
near-ties, so a real loop's tau can differ slightly.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib

import torch  # noqa: E402

from minispec.cli import ranged, run_main  # noqa: E402

PROG = "ngram_ceiling"


def longest_lookup(context: list[int], gamma: int) -> list[int]:
    """Continue after the earlier position whose preceding tokens match the context's suffix for
    the longest stretch (ties: the most recent)."""
    best_len, best_end = 0, -1
    for end in range(len(context) - 2, -1, -1):  # context[end] would stand for the last token
        length = 0
        while end - length >= 0 and context[end - length] == context[len(context) - 1 - length]:
            length += 1
        if length > best_len:
            best_len, best_end = length, end
    return context[best_end + 1:best_end + 1 + gamma] if best_len else []


def earliest_lookup(context: list[int], gamma: int, max_ngram: int = 3) -> list[int]:
    """The first occurrence (from the start) of the last n tokens, n = max_ngram down to 1."""
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        suffix = context[-n:]
        for start in range(len(context) - n):
            if context[start:start + n] == suffix:
                return context[start + n:start + n + gamma]
    return []


def offline_tau(lookup, prompt: list[int], greedy: list[int], gamma: int) -> float:
    """tau of `lookup` drafting against the target's greedy continuation `greedy` (see the module docstring)."""
    emitted, steps = greedy[:1], 0  # the prefill gives the first token
    while len(emitted) < len(greedy):
        g = min(gamma, len(greedy) - len(emitted) - 1)  # never draft past the end, as the loop does
        draft = lookup(prompt + emitted, g) if g > 0 else []
        n = 0
        while n < len(draft) and draft[n] == greedy[len(emitted) + n]:
            n += 1
        emitted = greedy[:len(emitted) + n + 1]
        steps += 1
    return (len(greedy) - 1) / steps if steps else 1.0


def main(argv: list[str] | None = None) -> int:
    p = benchlib.Parser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", type=Path, default=None, help="checkpoint folder (if not given: the default one)")
    p.add_argument("--dtype", choices=benchlib.DTYPES, default="float32", help="the target's dtype")
    p.add_argument("--prompts", type=ranged(int, "--prompts", lo=1), default=4, help="prompts per set")
    p.add_argument("--max-new-tokens", type=ranged(int, "--max-new-tokens", lo=2), default=128,
                   help="most new tokens of each greedy run (stops at eos)")
    p.add_argument("--gammas", type=benchlib.number_list(int, "--gammas", 1), default="3,5,8",
                   help="comma-separated draft lengths")
    args = p.parse_args(argv)
    return run_main(PROG, lambda: table(args))


def table(args) -> int:
    """Print the markdown table described in the module docstring."""
    import minispec
    from minispec.chain.drafters import NgramDrafter
    from minispec.chain.speculative import generate_chain as generate

    ckpt = benchlib.checkpoint(args.ckpt)
    tokenizer = minispec.load_tokenizer(ckpt)
    model = benchlib.load_minispec(ckpt, getattr(torch, args.dtype), "fast").model
    variants = {f"ngram {lo}-{hi}": NgramDrafter(hi, lo).lookup for lo, hi in ((1, 3), (2, 3), (1, 2), (1, 4), (2, 5))}
    variants.update({"longest": longest_lookup, "earliest": earliest_lookup})
    rows = []
    for name in ("summarization", "rag"):
        runs = []
        for prompt in benchlib.load_prompts([name], args.prompts, tokenizer):
            with torch.inference_mode():
                out = generate(model, prompt.ids, max_new_tokens=args.max_new_tokens,
                               eos_token_ids=tokenizer.eos_token_ids)
            runs.append((prompt.ids, out.tokens))
        for gamma in args.gammas:
            taus = [statistics.median(offline_tau(lookup, p, g, gamma) for p, g in runs) for lookup in variants.values()]
            rows.append([name, str(gamma)] + [f"{t:.2f}" for t in taus])
    print(benchlib.md_table(["set", "gamma", *variants], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
