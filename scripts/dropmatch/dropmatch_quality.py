"""DropMatch through the real loop: tau next to quality, each against its base, with intervals.

    python scripts/dropmatch/dropmatch_quality.py [--drafters ngram:3] [--gammas 5,10] [--ps 0.3,auto] [--temperatures 0,1]

For every drafter x gamma x temperature it runs the base policy (exact at T = 0, speculative
sampling at T = 1) and DropMatch at each p (K = --paths, criterion --criterion, OR-ed with that
base) on the same prompts, and reports per configuration:

    tau            tokens per verify step (incl. the correction/bonus token), pooled over prompts
    tau gain       tau / tau of the base - 1, 95% bootstrap interval over prompts (paired)
    NLL            the fp32 target's mean NLL of the produced tokens (one forward over prompt +
                   output); change vs the base as a relative difference of the per-prompt means
    agreement      T = 0 only, vs the target's own greedy output (plain decoding): "prefix" =
                   tokens before the first difference, "match" = equal positions, both over the
                   longer length (the base is lossless: 1.0 up to float near-ties)
    task score     `addition`: "What is a + b?" for a, b in 0..9 (100 problems), correct iff the
                   output's last number is a + b; GSM8K: the last number equals the gold answer.
                   Change vs the base in points, 95% bootstrap interval over problems (paired)
    speed-up       median over prompts of tok/s over the base's tok/s on the same prompt

p = "auto": minispec.lab.dropout_calibration picks p per prompt, as `--dropout-p auto` does
(the p whose estimated all-K head agreement on the target's first 32 greedy tokens is --level).

Outputs: out/dropmatch_quality/ (git-ignored): records.jsonl (one record per configuration and
prompt, appended as the run goes; --resume keeps them and runs only what is missing),
dropmatch_quality.json and .md; a Pareto plot with scripts/dropmatch/dropmatch_plot.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from benchlib import fmt, md_table, median
from rules.bench_policies import gsm8k_correct, target_nll, token_agreement
from dropmatch_replay import continuations, set_counts

import torch  # noqa: E402

from minispec import acceptance  # noqa: E402
from minispec.acceptance.dropmatch.rule import CRITERIA  # noqa: E402
from minispec.lab.dropout_calibration import DEFAULT_LEVEL, auto_dropout_p  # noqa: E402
from minispec.cli import ranged  # noqa: E402

PROG = "dropmatch_quality"


def addition_prompts(tokenizer) -> list[benchlib.Prompt]:
    """The 100 one-digit sums 'What is a + b?' (a, b in 0..9), chat-formatted; gold = a + b."""
    prompts = []
    for a in range(10):
        for b in range(10):
            prompt = benchlib.Prompt("addition", 10 * a + b, f"{a}+{b}", f"What is {a} + {b}?", gold=str(a + b))
            prompt.ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}])
            prompts.append(prompt)
    return prompts


def bootstrap_ci(values: list[tuple[float, ...]], statistic, resamples: int = 1000, seed: int = 0) -> list[float] | None:
    """95% percentile interval of statistic(resampled rows) over rows (prompts) drawn with replacement."""
    if not values:
        return None
    rows = torch.tensor(values, dtype=torch.float64)  # [P, fields]
    picks = torch.randint(len(values), (resamples, len(values)), generator=torch.Generator().manual_seed(seed))
    stats = torch.tensor([statistic(rows[pick]) for pick in picks], dtype=torch.float64)
    low, high = torch.quantile(stats, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return [low, high]


def tau_ratio(rows: torch.Tensor) -> float:
    """rows [P, 4]: tokens, steps, base tokens, base steps -> pooled tau / pooled base tau - 1."""
    return float((rows[:, 0].sum() / rows[:, 1].sum()) / (rows[:, 2].sum() / rows[:, 3].sum()) - 1)


def compare(records: list[dict], base: list[dict]) -> dict:
    """A DropMatch configuration against its base on the same prompts (paired by prompt)."""
    pairs = [(r, b) for r, b in zip(records, base) if r["steps"] and b["steps"]]
    tau_rows = [(r["tokens_emitted"], r["steps"], b["tokens_emitted"], b["steps"]) for r, b in pairs]
    nll_rows = [(r["nll"], b["nll"]) for r, b in zip(records, base) if r["nll"] is not None and b["nll"] is not None]
    nll_change = lambda rows: float(rows[:, 0].mean() / rows[:, 1].mean() - 1)  # noqa: E731
    out = {"tau_gain": tau_ratio(torch.tensor(tau_rows, dtype=torch.float64)) if tau_rows else None,
           "tau_gain_ci": bootstrap_ci(tau_rows, tau_ratio),
           "nll_change": nll_change(torch.tensor(nll_rows, dtype=torch.float64)) if nll_rows else None,
           "nll_change_ci": bootstrap_ci(nll_rows, nll_change),
           "speedup_vs_base": median(r["tokens_per_second"] / b["tokens_per_second"] for r, b in zip(records, base))}
    for key in ("agree_prefix", "agree_match", "correct"):
        rows = [(float(r[key]), float(b[key])) for r, b in zip(records, base) if r.get(key) is not None]
        diff = lambda rows: float((rows[:, 0] - rows[:, 1]).mean())  # noqa: E731
        out[f"{key}_change"] = diff(torch.tensor(rows, dtype=torch.float64)) if rows else None
        out[f"{key}_change_ci"] = bootstrap_ci(rows, diff)
    return out


def summarise(records: list[dict]) -> dict:
    steps = sum(r["steps"] for r in records)
    share = lambda key: (sum(float(r[key]) for r in records if r.get(key) is not None)  # noqa: E731
                         / max(1, sum(1 for r in records if r.get(key) is not None))
                         if any(r.get(key) is not None for r in records) else None)
    return {"prompts": len(records), "tau": sum(r["tokens_emitted"] for r in records) / steps if steps else None,
            "nll": share("nll"), "agree_prefix": share("agree_prefix"), "agree_match": share("agree_match"),
            "score": share("correct"), "p_mean": share("p"),
            "heads_agree": (sum(r["heads_agree"] for r in records) / max(1, sum(r["positions"] for r in records))),
            "dropmatch_only": sum(r["dropmatch_only"] for r in records)}


def run_one(model, nll_model, tokenizer, prompt, reference, drafter, gamma: int, temperature: float, p, args,
            auto_ps: dict) -> dict:
    from minispec.chain.speculative import generate_chain as generate

    chosen_p = None
    eos = list(tokenizer.eos_token_ids)
    if p is None:
        policy = acceptance.get("exact" if temperature == 0 else "sampling")
    else:
        if p == "auto" and (prompt.set, prompt.source_id) not in auto_ps:  # the greedy reference IS the calibration text
            auto_ps[prompt.set, prompt.source_id] = auto_dropout_p(nll_model, prompt.ids, args.paths, args.level,
                                                                   continuation=reference[:32])
        chosen_p = auto_ps[prompt.set, prompt.source_id] if p == "auto" else p
        policy = acceptance.get("dropmatch", p=chosen_p, paths=args.paths, criterion=args.criterion, seed=args.seed)
    out = generate(model, prompt.ids, max_new_tokens=prompt_tokens(prompt, args), draft=drafter, policy=policy,
                   gamma=gamma, temperature=temperature, seed=args.seed, eos_token_ids=eos)
    s, info = out.stats, out.stats.get("policy_info") or {}
    record = {"set": prompt.set, "source_id": prompt.source_id, "p": chosen_p, "tokens": out.tokens,
              "steps": s.get("verify_steps") or 0, "tokens_emitted": (s.get("num_accepted") or 0) + (s.get("verify_steps") or 0),
              "tokens_per_second": s["tokens_per_second"], "heads_agree": info.get("heads_agree", 0),
              "positions": info.get("positions", 0), "dropmatch_only": info.get("accepted_by_dropmatch_only", 0)}
    record["nll"] = target_nll(nll_model, prompt.ids, out.tokens)[0]
    if temperature == 0:
        record["agree_prefix"], record["agree_match"] = token_agreement(out.tokens, reference)
    if prompt.gold is not None:
        record["correct"] = gsm8k_correct(tokenizer.decode(out.tokens, skip_special_tokens=True), prompt.gold)
    return record


def prompt_tokens(prompt, args) -> int:
    return args.addition_tokens if prompt.set == "addition" else args.max_new_tokens


def measure(args, ckpt) -> dict:
    import minispec

    tokenizer = minispec.load_tokenizer(ckpt)
    eos = list(tokenizer.eos_token_ids)
    nll_model = minispec.load_model(ckpt, dtype=torch.float32)  # reference kernels: NLL and auto p (needs lm_head)
    loaded = benchlib.load_minispec(ckpt, torch.float32, "fast", drafters=args.drafters)
    model = loaded.model
    groups = {"spec_bench+gsm8k": [p for name, n in args.sets for p in benchlib.load_prompts([name], n, tokenizer)]}
    if args.addition:
        groups["addition"] = addition_prompts(tokenizer)
    cache = benchlib.ROOT / "out" / "dropmatch"
    references = {name: continuations(model, prompts, prompt_tokens(prompts[0], args), eos, cache, ckpt)
                  for name, prompts in groups.items()}
    out_dir = benchlib.out_dir(PROG, args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "records.jsonl"
    done = {}  # --resume: the records of an earlier run into the same folder, kept and not run again
    if args.resume and path.is_file():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            done[r["drafter"], r["gamma"], r["temperature"], r["policy"], r["set"], r["source_id"]] = r
    sink = path.open("w", encoding="utf-8")
    records, auto_ps = [], {}
    ps = [None] + list(args.ps)  # None: the base
    for drafter_name in args.drafters:
        for gamma in args.gammas:
            for temperature in args.temperatures:
                for p in ps:
                    label = f"{drafter_name} g{gamma} T{temperature:g} " + ("base" if p is None else f"dropmatch p={p}")
                    print(f"{PROG}: {label} ...", file=sys.stderr)
                    for group, prompts in groups.items():
                        for prompt, reference in zip(prompts, references[group]):
                            policy_name = "base" if p is None else f"p={p}"
                            key = (drafter_name, gamma, temperature, policy_name, prompt.set, prompt.source_id)
                            if key in done:
                                records.append(done[key])
                                sink.write(json.dumps(done[key]) + "\n")
                                continue
                            r = run_one(model, nll_model, tokenizer, prompt, reference, loaded.drafters[drafter_name],
                                        gamma, temperature, p, args, auto_ps)
                            r.update(drafter=drafter_name, gamma=gamma, temperature=temperature,
                                     policy="base" if p is None else f"p={p}", group=group)
                            sink.write(json.dumps(r) + "\n")
                            sink.flush()
                            records.append(r)
    sink.close()
    return {"settings": {"sets": [f"{n}:{k}" for n, k in args.sets], "addition": args.addition,
                         "max_new_tokens": args.max_new_tokens, "addition_tokens": args.addition_tokens,
                         "drafters": list(args.drafters), "gammas": list(args.gammas),
                         "temperatures": list(args.temperatures), "ps": [str(p) for p in args.ps], "paths": args.paths,
                         "criterion": args.criterion, "level": args.level, "seed": args.seed},
            "rows": table_rows(records)}


def table_rows(records: list[dict]) -> list[dict]:
    """One row per (drafter, gamma, T, policy) and prompt group ("spec_bench", "gsm8k", "addition",
    "all text" = spec_bench + gsm8k): summary, and for DropMatch the comparison with its base."""
    def group_of(r):
        return ("addition",) if r["group"] == "addition" else ("gsm8k" if r["set"] == "gsm8k" else "spec_bench", "all text")

    buckets: dict[tuple, list[dict]] = {}
    for r in records:
        for g in group_of(r):
            buckets.setdefault((r["drafter"], r["gamma"], r["temperature"], g, r["policy"]), []).append(r)
    rows = []
    for (drafter, gamma, temperature, group, policy), recs in buckets.items():
        row = {"drafter": drafter, "gamma": gamma, "temperature": temperature, "group": group, "policy": policy,
               **summarise(recs)}
        base = buckets.get((drafter, gamma, temperature, group, "base"))
        if policy != "base" and base is not None:
            row.update(compare(recs, base))
        rows.append(row)
    return rows


def _ci(row: dict, key: str, spec: str) -> str:
    value, ci = row.get(key), row.get(f"{key}_ci")
    if value is None:
        return "–"
    return f"{value:{spec}}" + ("" if ci is None else f" [{ci[0]:{spec}}, {ci[1]:{spec}}]")


def render(result: dict) -> str:
    s, rows = result["settings"], result["rows"]
    header = ["drafter", "gamma", "T", "prompts", "policy", "p (mean)", "tau", "tau gain [95% CI]", "speed-up vs base",
              "NLL", "NLL change [95% CI]", "agree prefix", "prefix change [95% CI]", "score", "score change [95% CI]",
              "heads agree", "DM-only tokens"]
    body = [[r["drafter"], str(r["gamma"]), f"{r['temperature']:g}", f"{r['group']} ({r['prompts']})", r["policy"],
             fmt(r["p_mean"], ".4f"), fmt(r["tau"]), _ci(r, "tau_gain", "+.1%"), fmt(r.get("speedup_vs_base")),
             fmt(r["nll"], ".3f"), _ci(r, "nll_change", "+.1%"), fmt(r["agree_prefix"], ".2f"),
             _ci(r, "agree_prefix_change", "+.2f"), fmt(r["score"], ".1%"), _ci(r, "correct_change", "+.1%"),
             fmt(r["heads_agree"], ".1%") if r["policy"] != "base" else "", str(r["dropmatch_only"])]
            for r in rows]
    return "\n".join([
        "# minispec: DropMatch in the real loop, against its base\n", benchlib.record_markdown(result["run"]),
        f"Prompts: {', '.join(s['sets'])} ({s['max_new_tokens']} new tokens)"
        + (f"; addition: 100 problems ({s['addition_tokens']} new tokens)" if s["addition"] else "")
        + f". DropMatch K = {s['paths']}, {s['criterion']}, OR-ed with its base (exact at T = 0, speculative sampling "
          f"at T = 1); 'auto': per prompt, estimated all-K agreement {s['level']}. Intervals: 95% bootstrap over "
          "prompts, paired with the base.\n", md_table(header, body), ""])


def parse_p(text: str):
    items = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        if item == "auto":
            items.append("auto")
            continue
        try:
            value = float(item)
        except ValueError:
            value = -1.0
        if not 0 <= value < 1:
            raise benchlib.argparse.ArgumentTypeError(f"--ps = {text!r}: {item!r}; expected numbers in [0, 1) or 'auto'")
        items.append(value)
    return tuple(items)


def build_parser() -> benchlib.Parser:
    p = benchlib.script_parser(PROG, __doc__)
    p.add_argument("--sets", type=set_counts, default="translation:10,summarization:10,qa:10,math_reasoning:10,rag:10,"
                   "gsm8k:50", help="comma-separated prompt sets, each 'name:N' (its first N prompts)")
    p.add_argument("--no-addition", dest="addition", action="store_false", help="leave out the addition problems")
    p.add_argument("--max-new-tokens", type=ranged(int, "--max-new-tokens", lo=2), default=128)
    p.add_argument("--addition-tokens", type=ranged(int, "--addition-tokens", lo=2), default=48)
    p.add_argument("--drafters", type=benchlib.name_list("--drafters", lambda s: (s,)), default="ngram:3",
                   help="comma-separated drafter specs (as --draft takes them)")
    p.add_argument("--gammas", type=benchlib.number_list(int, "--gammas", 1), default="5,10")
    p.add_argument("--temperatures", type=benchlib.number_list(float, "--temperatures", 0), default="0,1")
    p.add_argument("--ps", type=parse_p, default="0.3,auto", help="DropMatch's p values ('auto': calibrated per prompt)")
    p.add_argument("--paths", type=ranged(int, "--paths", lo=1), default=5, help="DropMatch K")
    p.add_argument("--criterion", choices=CRITERIA, default="js_or_majority")
    p.add_argument("--level", type=ranged(float, "--level", lo=0, hi=1, lo_open=True), default=DEFAULT_LEVEL,
                   help="'auto': the estimated all-K head agreement to aim for")
    p.add_argument("--seed", type=ranged(int, "--seed", lo=0), default=0)
    p.add_argument("--resume", action="store_true",
                   help="keep the records already in --out's records.jsonl and run only what is missing")
    return p


def main(argv: list[str] | None = None) -> int:
    return benchlib.run_benchmark(PROG, argv, build_parser(), measure, render)


if __name__ == "__main__":
    sys.exit(main())
