"""Adaptive draft length: the heuristic schedule and a confidence cut-off (p_min) against a fixed gamma.

    python scripts/speed/bench_draft_length.py [--prompts 2] [--quick] [--gammas 3,5,8] [--p-mins 0.3,0.5,0.7]

At temperature 0 with the exact policy, on Spec-Bench prompts (--sets, --prompts of each), with
the default fast kernels (float32 target), up to --max-new-tokens new tokens (stops at eos).
Per prompt, in turn (so a drift in the machine's speed hits every configuration alike):

    plain                      plain greedy decoding: the baseline of every ratio
    <drafter> fixed gN         gamma N every step, for each N in --gammas
    <drafter> heuristic g<=M   minispec.chain.draft_length.Heuristic capped at M = max(--gammas)
    self:bf16 fixed gM p>=P    a fixed M with the model drafter's cut-off p_min = P, each P in --p-mins
                               (the n-gram drafter has no probabilities: schedules only)

Drafters: self:bf16 (the target's own weights in bfloat16, built before the kernels rewrite the
target) and ngram (prompt lookup, n = 3). Per configuration, medians over prompts of: tau (tokens
per verify step, the correction/bonus counted), acceptance (accepted / drafted), drafted per
step, draft forwards and verify steps per generated token, tok/s end to end, and speed = tok/s /
plain tok/s on the same prompt (the median of the per-prompt ratios); "= plain" counts the
prompts whose output equals plain greedy decoding's (float32: a (g+1)-row verify may still part
from a 1-row decode step at a near-tie).

Writes bench_draft_length.json and .md to --out (default out/bench_draft_length/).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from benchlib import fmt, md_table, median, ratio

import torch  # noqa: E402

from minispec.cli import ranged  # noqa: E402

PROG = "bench_draft_length"
DRAFTERS = ("self:bf16", "ngram")
DEFAULT_SETS = ("mt_bench", "summarization", "qa", "rag")


@dataclass(frozen=True)
class Config:
    drafter: str | None  # None: plain decoding
    schedule: str = "fixed"  # a minispec.chain.draft_length name
    gamma: int | None = None  # the loop's gamma: the most drafted per step
    p_min: float = 0.0  # the model drafter's confidence cut-off (0 = off)

    @property
    def label(self) -> str:
        if self.drafter is None:
            return "plain"
        length = f"fixed g{self.gamma}" if self.schedule == "fixed" else f"{self.schedule} g<={self.gamma}"
        return f"{self.drafter} {length}" + (f" p>={self.p_min:g}" if self.p_min > 0 else "")


def configs(drafters, gammas, p_mins) -> list[Config]:
    """Plain; per drafter each fixed gamma and the heuristic up to the largest; a model drafter's
    cut-offs at the largest fixed gamma."""
    top = max(gammas)
    out = [Config(None)]
    for drafter in drafters:
        out += [Config(drafter, "fixed", g) for g in gammas] + [Config(drafter, "heuristic", top)]
        if drafter != "ngram":
            out += [Config(drafter, "fixed", top, p) for p in p_mins if p > 0]
    return out


def with_p_min(drafter, p_min: float):
    """The same drafter with another cut-off: a ModelDrafter over the same model (n-gram: itself)."""
    from minispec.chain.drafters import ModelDrafter

    if p_min == 0 or not isinstance(drafter, ModelDrafter):
        return drafter
    return ModelDrafter(drafter.model, num_layers=drafter.num_layers, name=drafter.name,
                        share_cache=drafter.share_cache, p_min=p_min)


def bench(model, drafters: dict, prompts: dict[str, list[list[int]]], config_list: list[Config],
          max_new_tokens: int, eos: list[int]) -> list[dict]:
    """Every configuration on every prompt, taking turns per prompt: one record each."""
    from minispec.chain.speculative import generate_chain as generate

    records = []
    for set_name, prompt_list in prompts.items():
        for i, ids in enumerate(prompt_list):
            plain_tokens = None
            for config in config_list:
                options = {} if config.drafter is None else dict(
                    draft=with_p_min(drafters[config.drafter], config.p_min), policy="exact", gamma=config.gamma,
                    draft_length=config.schedule)
                out = generate(model, ids, max_new_tokens=max_new_tokens, eos_token_ids=eos, **options)
                s, n = out.stats, len(out.tokens)
                plain_tokens = out.tokens if config.drafter is None else plain_tokens
                records.append({
                    "set": set_name, "prompt": i, "label": config.label, "drafter": config.drafter or "plain",
                    "schedule": config.schedule if config.drafter else None, "gamma": config.gamma,
                    "p_min": config.p_min, "prompt_tokens": len(ids), "new_tokens": n, "tokens": out.tokens,
                    "tps": s["tokens_per_second"], "tau": s["tau"],
                    "acceptance": s.get("acceptance_rate") if config.drafter else None,
                    "drafted_per_step": ratio(s.get("num_drafted"), s.get("verify_steps")),
                    "draft_forwards_per_token": s["draft_forwards"] / n,
                    "target_forwards_per_token": s["target_forwards"] / n,  # the prefill included
                    "same_as_plain": out.tokens == plain_tokens,
                })
    return records


def summarise(records: list[dict]) -> list[dict]:
    """One row per configuration: medians over prompts, and the median of per-prompt tok/s over
    plain tok/s on the same prompt."""
    plain = {(r["set"], r["prompt"]): r["tps"] for r in records if r["drafter"] == "plain"}
    rows = []
    for label in dict.fromkeys(r["label"] for r in records):
        sel = [r for r in records if r["label"] == label]
        first = sel[0]
        rows.append({
            "label": label, "drafter": first["drafter"], "schedule": first["schedule"], "gamma": first["gamma"],
            "p_min": first["p_min"], "prompts": len(sel),
            **{key: median(r[key] for r in sel) for key in ("tau", "acceptance", "drafted_per_step",
                                                              "draft_forwards_per_token", "target_forwards_per_token",
                                                              "tps", "new_tokens")},
            "speed": median(ratio(r["tps"], plain.get((r["set"], r["prompt"]))) for r in sel),
            "same_as_plain": sum(r["same_as_plain"] for r in sel),
        })
    return rows


def render(result: dict) -> str:
    s = result["settings"]
    intro = (f"T = 0, exact policy, fast kernels, float32 target; up to {s['max_new_tokens']} new tokens (stops at "
             f"eos); {s['prompts']} prompts of each of {', '.join(s['sets'])} ({s['num_prompts']} in all). Medians over "
             "prompts. speed = tok/s / plain tok/s on the same prompt; tau counts the correction/bonus token; "
             "drafted/step = draft tokens per verify step; draft fwd/token and target fwd/token = forward passes per "
             "generated token (the target's prefill included); '= plain' = outputs equal to plain greedy decoding's.\n")
    table = md_table(["config", "tau", "accept", "drafted/step", "draft fwd/token", "target fwd/token", "tok/s",
                      "speed", "= plain"],
                     [[r["label"], fmt(r["tau"]), fmt(r["acceptance"], ".0%"), fmt(r["drafted_per_step"]),
                       fmt(r["draft_forwards_per_token"]), fmt(r["target_forwards_per_token"]), fmt(r["tps"], ".1f"),
                       fmt(r["speed"], ".2f", "x"), f"{r['same_as_plain']}/{r['prompts']}"] for r in result["rows"]])
    return "\n".join(["# minispec: adaptive draft length\n", benchlib.record_markdown(result["run"]), intro, table + "\n"])


# ---------------------------------------------------------------------------------------- main


def probability_list(text: str) -> tuple[float, ...]:
    """--p-mins: comma-separated numbers in [0, 1]."""
    values = benchlib.number_list(float, "--p-mins", 0)(text)
    if any(v > 1 for v in values):
        raise argparse.ArgumentTypeError(f"--p-mins = {text!r}; expected comma-separated numbers in [0, 1]")
    return values


def build_parser() -> benchlib.Parser:
    p = benchlib.script_parser(PROG, __doc__)
    p.add_argument("--sets", type=benchlib.name_list("--sets", benchlib.SPEC_BENCH_SETS), default=",".join(DEFAULT_SETS),
                   help="comma-separated Spec-Bench categories")
    p.add_argument("--prompts", type=ranged(int, "--prompts", lo=1), default=2, help="prompts per set")
    p.add_argument("--max-new-tokens", type=ranged(int, "--max-new-tokens", lo=1), default=128,
                   help="most new tokens per generation (stops at eos)")
    p.add_argument("--gammas", type=benchlib.number_list(int, "--gammas", 1), default="3,5,8",
                   help="comma-separated fixed draft lengths; the heuristic and the cut-offs use the largest")
    p.add_argument("--p-mins", type=probability_list, default="0.3,0.5,0.7",
                   help="comma-separated confidence cut-offs for the model drafter, each in [0, 1]")
    p.add_argument("--drafters", type=benchlib.name_list("--drafters", DRAFTERS), default=",".join(DRAFTERS),
                   help="comma-separated")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 1 prompt of each set, 32 new tokens")
    return p


def run(args, ckpt: Path) -> dict:
    """Load the target and drafters on the fast kernels, warm up, then every configuration per prompt."""
    import minispec
    from minispec.chain.speculative import generate_chain as generate

    prompts_per_set, max_new = (1, 32) if args.quick else (args.prompts, args.max_new_tokens)
    tokenizer = minispec.load_tokenizer(ckpt)
    prompts = {name: [p.ids for p in benchlib.load_prompts([name], prompts_per_set, tokenizer)] for name in args.sets}
    eos = list(tokenizer.eos_token_ids)
    print(f"{PROG}: loading ...", file=sys.stderr)
    loaded = benchlib.load_minispec(ckpt, torch.float32, "fast", drafters=args.drafters)  # self-draft, then kernels
    drafters = loaded.drafters  # "ngram" is prompt lookup with n = 3
    config_list = configs(args.drafters, args.gammas, args.p_mins)
    warm = next(iter(prompts.values()))[0]
    with torch.inference_mode():  # first calls pay one-time costs (allocations, oneDNN primitives)
        generate(loaded.model, warm, max_new_tokens=8, eos_token_ids=[])
        for drafter in drafters.values():
            generate(loaded.model, warm, max_new_tokens=8, draft=drafter, gamma=max(args.gammas), eos_token_ids=[])
    print(f"{PROG}: {len(config_list)} configurations x {sum(map(len, prompts.values()))} prompts ...", file=sys.stderr)
    with torch.inference_mode():
        records = bench(loaded.model, drafters, prompts, config_list, max_new, eos)
    return {"settings": {"sets": list(args.sets), "prompts": prompts_per_set, "max_new_tokens": max_new,
                         "num_prompts": sum(map(len, prompts.values())), "gammas": list(args.gammas),
                         "p_mins": list(args.p_mins), "drafters": list(args.drafters), "kernels": "fast",
                         "dtype": "float32"},
            "rows": summarise(records), "records": records}


def main(argv: list[str] | None = None) -> int:
    return benchlib.run_benchmark(PROG, argv, build_parser(), run, render)


if __name__ == "__main__":
    sys.exit(main())
