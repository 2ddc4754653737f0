"""How far can prompt lookup go on the benchmark's prompts? tau of n-gram drafters, offline.

    python scripts/ngram_ceiling.py [--dtype float32] [--prompts 4] [--gammas 3,5,8]

At temperature 0 with exact match, a draft token is accepted iff it equals the target's greedy
token there, so one plain greedy run per prompt (the fast path, up to 128 new tokens or eos,
as bench_speed's speculative section) decides every step of every n-gram variant offline:

    step:  draft = lookup(prompt + emitted, g);  n = longest prefix of draft equal to greedy's;
           emit n + 1 tokens (the accepted drafts and the target's own next token)
    tau  = tokens emitted / steps

Speculation's speed-up over plain decoding is at most tau: a verify pass costs at least a decode
step. The variants: minispec's NgramDrafter (most recent match of the last n tokens, n from
max down to min) for several (min, max); "longest" (the earlier position whose preceding tokens
match the context's suffix for the longest stretch); "earliest" (the first match in the context,
as transformers' prompt lookup takes it). Prints one table row per set x gamma: median tau over
the prompts for each variant. Prompt ids: the first --prompts of each set, as bench_speed uses.
Exact in float32; in bfloat16 a verify pass may round differently from a decode step at
near-ties, so a real loop's tau can differ slightly.
"""

from __future__ import annotations

import argparse
import statistics

import torch


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


def main() -> None:
    import minispec
    from minispec import fast
    from minispec.bench import default_data_dir, load_prompts
    from minispec.drafters import NgramDrafter
    from minispec.speculative import generate
    from minispec.weights import ensure_default_checkpoint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per set (default 4, as bench_speed)")
    parser.add_argument("--gammas", default="3,5,8")
    args = parser.parse_args()
    gammas = [int(g) for g in args.gammas.split(",")]

    ckpt = ensure_default_checkpoint()
    tokenizer = minispec.load_tokenizer(ckpt)
    model = fast.optimize(minispec.load_model(ckpt, dtype=getattr(torch, args.dtype)))
    variants = {f"ngram {lo}-{hi}": NgramDrafter(hi, lo).lookup for lo, hi in ((1, 3), (2, 3), (1, 2), (1, 4), (2, 5))}
    variants.update({"longest": longest_lookup, "earliest": earliest_lookup})
    print(f"| set | gamma | {' | '.join(variants)} |")
    print(f"|---|---|{'---|' * len(variants)}")
    for name in ("summarization", "rag"):
        runs = []
        for prompt in load_prompts([name], args.prompts, default_data_dir(), tokenizer):
            with torch.inference_mode():
                out = generate(model, prompt.ids, max_new_tokens=128, eos_token_ids=tokenizer.eos_token_ids)
            runs.append((prompt.ids, out.tokens))
        for gamma in gammas:
            taus = [statistics.median(offline_tau(lookup, p, g, gamma) for p, g in runs) for lookup in variants.values()]
            print(f"| {name} | {gamma} | {' | '.join(f'{t:.2f}' for t in taus)} |")


if __name__ == "__main__":
    main()
