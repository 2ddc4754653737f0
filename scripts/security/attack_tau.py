"""Acceleration collapse: prompt perturbations that lower tau while the target's output stays the same.

    python scripts/security/attack_tau.py [--ckpt CKPT] [--drafters ngram,early-exit:24,self:bf16]
        [--sets humaneval,mt_bench] [--prompts 2] [--rounds 4] [--candidates 6] [--max-new-tokens 32]

Speculation is fast only while the draft agrees with the target. An attacker who can shape a
prompt (Mistletoe, arXiv 2605.14005) looks for small changes that cut that agreement but leave
the answer as it was, so nobody notices anything but the slowdown. This script runs the simplest
such search, per drafter and prompt, at temperature 0:

    score(prompt)  = tau of greedy speculative decoding with the exact policy (lossless: its output
                     IS the target's greedy output, so one run gives both)
    each round:    --candidates perturbations of the current prompt's text (a typo swapping two
                   letters, a word's first letter re-cased, a space doubled, a punctuation mark
                   dropped, a neutral suffix appended), drawn with a seeded random.Random; the one
                   with the lowest tau becomes the current prompt if it is below the current tau
    kept:          "same", the lowest-tau candidate whose output equals the benign prompt's token
                   for token (the collapse nobody notices), and "any", the lowest-tau candidate
                   whatever its output (an attacker who only wants the slowdown)

Then, on the benign prompt and the two attacked ones, in turn (one run, so a drift in the machine's
speed hits both): plain greedy decoding (the baseline of every speed-up); each --policies rule
(tau, tok/s, speed-up, whether its output equals the target's greedy output); and the exact rule
with the per-request fallback (minispec.lab.draft_length.Fallback) at this drafter's measured
break-even

    tau* = (time of a speculative step) / (time of a plain step)      on the first benign prompt

below which a speculative step emits too few tokens to pay for itself.

Writes attack_tau.json and .md to --out (default out/attack_tau/). The search and the drafts are
seeded: the same flags give the same prompts and tokens (timings vary).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from benchlib import fmt, md_table, median, ratio

import torch  # noqa: E402

from minispec.cli import ranged  # noqa: E402

PROG = "attack_tau"
SUFFIXES = (" ", "\n", " Thanks.", " Please.", "\n\nThank you!")
PUNCTUATION = ".,;:!?"
SIDES = ("benign", "same", "any")  # the benign prompt, the attack that keeps the output, the one that need not


def perturb(text: str, rng: random.Random) -> str:
    """One small change to `text` that a reader would take for the same request."""
    words = [i for i, w in enumerate(text.split(" ")) if len(w) >= 4 and w.isalpha()]
    kind = rng.choice(["typo", "case", "space", "punctuation", "suffix"])
    parts = text.split(" ")
    if kind == "typo" and words:
        i = rng.choice(words)
        j = rng.randrange(1, len(parts[i]) - 1)
        w = parts[i]
        parts[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:]
        return " ".join(parts)
    if kind == "case" and words:
        i = rng.choice(words)
        parts[i] = parts[i][0].swapcase() + parts[i][1:]
        return " ".join(parts)
    if kind == "space" and len(parts) > 1:
        i = rng.randrange(1, len(parts))
        return " ".join(parts[:i]) + "  " + " ".join(parts[i:])
    marks = [i for i, c in enumerate(text) if c in PUNCTUATION]
    if kind == "punctuation" and marks:
        i = rng.choice(marks)
        return text[:i] + text[i + 1:]
    return text + rng.choice(SUFFIXES)


def greedy_run(model, tokenizer, text: str, drafter, policy: str, gamma: int, max_new: int, eos, draft_length="fixed"):
    from minispec.chain.speculative import generate_chain as generate

    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}])
    options = {} if drafter is None else dict(draft=drafter, policy=policy, gamma=gamma, draft_length=draft_length)
    return generate(model, ids, max_new_tokens=max_new, eos_token_ids=eos, **options)


def search(model, tokenizer, text: str, drafter, gamma: int, max_new: int, eos, rounds: int, candidates: int,
           seed: int) -> dict:
    """The greedy search above. It climbs on tau alone (an attacker who wants the slowdown at any
    price), and keeps, among every candidate it tried, the lowest-tau one whose output is the benign
    prompt's ("same": the collapse nobody sees) beside the lowest-tau one overall ("any")."""
    benign = greedy_run(model, tokenizer, text, drafter, "exact", gamma, max_new, eos)
    current = (text, benign.stats["tau"])
    same = any_output = current
    rng = random.Random(seed)
    tried = []
    for _ in range(rounds):
        best_of_round = None
        for _ in range(candidates):
            candidate = perturb(current[0], rng)
            out = greedy_run(model, tokenizer, candidate, drafter, "exact", gamma, max_new, eos)
            tau, valid = out.stats["tau"], out.tokens == benign.tokens
            tried.append({"tau": tau, "valid": valid})
            if valid and tau < same[1]:
                same = (candidate, tau)
            if tau < any_output[1]:
                any_output = (candidate, tau)
            if best_of_round is None or tau < best_of_round[1]:
                best_of_round = (candidate, tau)
        if best_of_round[1] < current[1]:
            current = best_of_round
    return {"benign_tau": benign.stats["tau"], "same_tau": same[1], "same_text": same[0],
            "any_tau": any_output[1], "any_text": any_output[0], "candidates": len(tried),
            "valid_candidates": sum(t["valid"] for t in tried)}


def break_even(model, tokenizer, text: str, drafter, gamma: int, max_new: int, eos) -> float:
    """tau* = seconds per speculative step / seconds per plain step, both on `text` (exact, greedy)."""
    plain = greedy_run(model, tokenizer, text, None, "exact", gamma, max_new, eos).stats
    spec = greedy_run(model, tokenizer, text, drafter, "exact", gamma, max_new, eos).stats
    plain_step = (plain["total_seconds"] - plain["prefill_seconds"]) / max(plain["num_generated_tokens"] - 1, 1)
    spec_step = (spec["total_seconds"] - spec["prefill_seconds"]) / max(spec["verify_steps"], 1)
    return min(max(spec_step / plain_step, 1.0), gamma + 1.0)


def evaluate(model, tokenizer, text: str, drafter, policies: dict, gamma: int, max_new: int, eos,
             tau_star: float) -> dict:
    """Plain, every policy ({label: policy}) and the exact policy with the fallback on one prompt text."""
    from minispec.lab.draft_length import Fallback

    plain = greedy_run(model, tokenizer, text, None, "exact", gamma, max_new, eos)
    rows = {"plain": {"tps": plain.stats["tokens_per_second"], "tau": 1.0, "same_as_greedy": True}}
    configs = [(label, p, "fixed") for label, p in policies.items()] + \
        [("exact+fallback", "exact", Fallback(gamma, round(tau_star, 3)))]
    for label, policy, length in configs:
        out = greedy_run(model, tokenizer, text, drafter, policy, gamma, max_new, eos, draft_length=length)
        rows[label] = {"tps": out.stats["tokens_per_second"], "tau": out.stats["tau"],
                       "speed": ratio(out.stats["tokens_per_second"], plain.stats["tokens_per_second"]),
                       "same_as_greedy": out.tokens == plain.tokens,
                       "plain_steps": out.stats.get("no_draft_steps")}
    return rows


def summarise(records: list[dict]) -> list[dict]:
    """One row per (drafter, configuration): medians over prompts, benign and attacked."""
    rows = []
    for drafter in dict.fromkeys(r["drafter"] for r in records):
        sel = [r for r in records if r["drafter"] == drafter]
        for label in sel[0]["benign"]:
            row = {"drafter": drafter, "config": label, "prompts": len(sel), "break_even": sel[0]["break_even"]}
            for side in SIDES:
                row[f"{side}_tau"] = median(r[side][label]["tau"] for r in sel)
                row[f"{side}_speed"] = median(r[side][label].get("speed") for r in sel)
                row[f"{side}_same"] = sum(r[side][label]["same_as_greedy"] for r in sel)
            rows.append(row)
    return rows


def render(result: dict) -> str:
    s = result["settings"]
    intro = (f"T = 0, gamma {s['gamma']}, {s['max_new_tokens']} new tokens; {s['num_prompts']} prompts "
             f"({', '.join(s['sets'])}); search: {s['rounds']} rounds x {s['candidates']} candidates; target "
             f"{s['dtype']} {s['kernels']}. 'same' = the lowest-tau perturbed prompt whose greedy output is the benign "
             "one's, token for token; 'any' = the lowest-tau one whatever its output. Medians over prompts. speed = "
             "tok/s over plain tok/s on the same prompt text in the same run; '= greedy' counts outputs equal to the "
             "target's greedy output on that prompt; tau* = the drafter's measured break-even (exact+fallback's "
             "setting).\n")
    table1 = md_table(["drafter", "prompt", "benign tau", "same-output tau", "any-output tau", "kept the output",
                       "same-output prompt (end)"],
                      [[r["drafter"], r["set"] + f"#{r['prompt']}", fmt(r["search"]["benign_tau"]),
                        fmt(r["search"]["same_tau"]), fmt(r["search"]["any_tau"]),
                        f"{r['search']['valid_candidates']}/{r['search']['candidates']}",
                        repr(r["search"]["same_text"][-50:])] for r in result["records"]])
    table2 = md_table(["drafter", "config", "tau*", "tau: benign / same / any", "speed: benign / same / any",
                       "= greedy: benign / same / any"],
                      [[r["drafter"], r["config"], fmt(r["break_even"]),
                        " / ".join(fmt(r[f"{side}_tau"]) for side in SIDES),
                        " / ".join(fmt(r[f"{side}_speed"], ".2f", "x") for side in SIDES),
                        " / ".join(f"{r[f'{side}_same']}/{r['prompts']}" for side in SIDES)]
                       for r in result["rows"]])
    return "\n".join(["# minispec: tau under attack\n", benchlib.record_markdown(result["run"]), intro,
                      "## The search\n", table1 + "\n", "## Benign and attacked, per rule\n", table2 + "\n"])


# ---------------------------------------------------------------------------------------- main


def build_parser() -> benchlib.Parser:
    p = benchlib.add_speculation_flags(benchlib.script_parser(PROG, __doc__))
    p.add_argument("--policies", type=benchlib.policy_list("--policies"), default="exact,typical,fly,dropmatch-lazy:p=0.3",
                   help="comma-separated acceptance rules, each NAME[:key=value,...], evaluated benign and attacked")
    p.add_argument("--sets", type=benchlib.name_list("--sets", benchlib.PROMPT_SETS), default="humaneval,mt_bench",
                   help="comma-separated prompt sets")
    p.add_argument("--prompts", type=ranged(int, "--prompts", lo=1, hi=100), default=2, help="prompts per set")
    p.add_argument("--rounds", type=ranged(int, "--rounds", lo=1, hi=100), default=4, help="search rounds")
    p.add_argument("--candidates", type=ranged(int, "--candidates", lo=1, hi=100), default=6,
                   help="perturbations tried per round")
    p.add_argument("--max-new-tokens", type=ranged(int, "--max-new-tokens", lo=2, hi=4096), default=32,
                   help="new tokens per generation (no early stop: every run is the same length)")
    p.add_argument("--seed", type=ranged(int, "--seed", lo=0), default=0, help="the search's seed")
    return p


def run(args, ckpt: Path) -> dict:
    import minispec

    built = {spec.text: spec.build() for spec in args.policies}
    drafter_specs = benchlib.speculation(PROG, args)
    tokenizer = minispec.load_tokenizer(ckpt)
    prompts = benchlib.load_prompts(args.sets, args.prompts, tokenizer)
    loaded = benchlib.load_minispec(ckpt, getattr(torch, args.dtype), args.kernels, drafters=drafter_specs)
    model, records = loaded.model, []
    max_new, gamma = args.max_new_tokens, args.gamma
    with torch.inference_mode():
        greedy_run(model, tokenizer, prompts[0].text, None, "exact", gamma, 8, [])  # warm-up
        for spec, drafter in loaded.drafters.items():
            greedy_run(model, tokenizer, prompts[0].text, drafter, "exact", gamma, 8, [])
            tau_star = break_even(model, tokenizer, prompts[0].text, drafter, gamma, max_new, [])
            print(f"{PROG}: {spec}: break-even tau* = {tau_star:.2f}", file=sys.stderr)
            for prompt in prompts:
                found = search(model, tokenizer, prompt.text, drafter, gamma, max_new, [], args.rounds,
                               args.candidates, args.seed + prompt.index)
                record = {"drafter": spec, "set": prompt.set, "prompt": prompt.index, "break_even": tau_star,
                          "search": found}
                for side, text in (("benign", prompt.text), ("same", found["same_text"]), ("any", found["any_text"])):
                    record[side] = evaluate(model, tokenizer, text, drafter, built, gamma, max_new, [], tau_star)
                records.append(record)
                print(f"{PROG}: {spec} {prompt.set}#{prompt.index}: tau {found['benign_tau']:.2f}; same output "
                      f"{found['same_tau']:.2f}; any output {found['any_tau']:.2f} ({found['valid_candidates']}/"
                      f"{found['candidates']} candidates kept the output)", file=sys.stderr)
    return {"settings": {"sets": list(args.sets), "prompts": args.prompts, "num_prompts": len(prompts),
                         "rounds": args.rounds, "candidates": args.candidates, "gamma": gamma,
                         "max_new_tokens": max_new, "drafters": drafter_specs, "policies": list(built),
                         "dtype": args.dtype, "kernels": args.kernels, "seed": args.seed},
            "rows": summarise(records), "records": records}


def main(argv: list[str] | None = None) -> int:
    return benchlib.run_benchmark(PROG, argv, build_parser(), run, render)


if __name__ == "__main__":
    sys.exit(main())
