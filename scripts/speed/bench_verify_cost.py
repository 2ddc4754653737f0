"""What a verify pass costs against a decode step, and the acceptance length tau each drafter needs.

    python scripts/speed/bench_verify_cost.py [--dtypes float32,bfloat16] [--kernels fast,compiled] [--gammas 3,5,8]

Speculative decoding pays off only if a pass over gamma + 1 new tokens costs little more than a
pass over one. This script measures that, and turns it into the tau a drafter must reach.

1. Pass cost: on a cache holding the first Spec-Bench summarization prompt, the median time of
   one target pass (blocks + LM head) of k new tokens, for each k in --rows plus 1 and
   gamma + 1 for every gamma. k = 1 is a decode step; k = gamma + 1 is a verify pass. Every pass
   is rolled back, so all see the same context; the row counts take turns within each
   repetition, so a drift in the machine's speed moves them all alike.
2. Draft cost per drafted token: n-gram, one lookup (with its one-hot q rows) on the same
   context; a self-draft (self:int8, and self:bf16 for a float32 target), a 1-row pass of the
   draft model on the same context. On the compiled kernels, n-gram only (compiling a draft
   model takes as long as compiling the target).
3. The ceiling: a step of gamma drafts costs gamma x draft + pass(gamma + 1) and yields tau
   tokens (accepted drafts + the correction or bonus, 1 <= tau <= gamma + 1), where plain
   decoding pays pass(1) per token, so

       speed-up(tau) = tau x pass(1) / (gamma x draft + pass(gamma + 1))

   "tau needed" is the tau at which the speed-up reaches --target; above gamma + 1 no drafter
   can reach it at that gamma. "all accepted" is the speed-up at tau = gamma + 1.

Writes bench_verify_cost.json and .md to --out (default out/bench_verify_cost/).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from minispec.kernels import measure as probe
from benchlib import md_table

import torch  # noqa: E402

from minispec.cli import ranged  # noqa: E402

PROG = "bench_verify_cost"


def pass_costs(model, context_ids: list[int], rows=(1, 2, 3, 4, 6, 9), reps: int = 25) -> dict[int, float]:
    """Median ms of one pass (blocks + LM head) of k new tokens on a cache that holds `context_ids`,
    for each k in rows (minispec.kernels.measure.pass_costs). Every pass is rolled back."""
    cache = model.new_cache(1, len(context_ids) + max(rows) + 1)
    with torch.inference_mode():
        model.forward_hidden(torch.tensor([context_ids]), cache)  # [1, S]: the prefill
    start = cache.length
    seconds = probe.pass_costs(model, cache, rows, rollback=lambda: cache.truncate(start), reps=reps)
    return {k: 1000 * s for k, s in seconds.items()}


def ngram_draft_ms(context_ids: list[int], gamma: int, vocab_size: int, reps: int = 25) -> float:
    """Median ms of one n-gram proposal (the lookup plus its one-hot q rows) on `context_ids`."""
    from minispec.chain.drafters import NgramDrafter
    from minispec.model.sampling import SamplingParams

    drafter = NgramDrafter(vocab_size=vocab_size)
    return 1000 * benchlib.timed(lambda: drafter.propose(context_ids, gamma, SamplingParams(0.0), None), reps)


def speculation_ceiling(costs: dict[int, float], draft_ms: float, gamma: int, target: float) -> dict:
    """What a verify step of `gamma` drafts costs, and the tau it needs to reach `target` (module
    docstring, 3); best_speedup: the speed-up if every draft were accepted (tau = gamma + 1)."""
    step_ms = gamma * draft_ms + costs[gamma + 1]
    return {"gamma": gamma, "draft_ms": draft_ms, "step_ms": step_ms,
            "tau_needed": target * step_ms / costs[1], "best_speedup": (gamma + 1) * costs[1] / step_ms}


def measure(ckpt, dtype: torch.dtype, kernels: str, context_ids: list[int], gammas, rows, reps: int,
            target: float) -> tuple[dict, list[dict]]:
    """Pass costs of one kernels kind, and the ceiling of each drafter at each gamma."""
    drafters = () if kernels == "compiled" else ("self:int8",) + (("self:bf16",) if dtype == torch.float32 else ())
    loaded = benchlib.load_minispec(ckpt, dtype, kernels, drafters=drafters, verify_rows=[g + 1 for g in gammas])
    costs = pass_costs(loaded.model, context_ids, rows, reps)
    draft_ms = {"ngram": {g: ngram_draft_ms(context_ids, g, loaded.model.config.vocab_size, reps) for g in gammas}}
    for name, drafter in loaded.drafters.items():
        step = pass_costs(drafter.model, context_ids, rows=(1,), reps=reps)[1]
        draft_ms[name] = {g: step for g in gammas}
    ceilings = [{"kernels": kernels, "drafter": name, **speculation_ceiling(costs, per_gamma[g], g, target)}
                for name, per_gamma in draft_ms.items() for g in gammas]
    return {"kernels": kernels, "context": len(context_ids), "pass_ms": costs}, ceilings


def render(result: dict) -> str:
    target = result["settings"]["target"]
    rows = sorted({int(k) for r in result["passes"] for k in r["pass_ms"]})
    parts = ["# minispec: what a verify pass costs\n", benchlib.record_markdown(result["run"]),
             "## Pass cost\n",
             "ms of one pass (blocks + LM head) of k new tokens on a cache holding the context, median; k = 1 is "
             "a decode step, k = gamma + 1 a verify pass; '/ step' = pass(k) / pass(1).\n",
             md_table(["dtype", "kernels", "context"] + [f"k={k} ms" for k in rows] + [f"k={k} / step" for k in rows if k > 1],
                      [[r["dtype"], r["kernels"], str(r["context"])]
                       + [f"{_cost(r, k):.1f}" for k in rows] + [f"{_cost(r, k) / _cost(r, 1):.2f}" for k in rows if k > 1]
                       for r in result["passes"]]) + "\n",
             "## The tau each drafter needs\n",
             f"A step of gamma drafts costs gamma x draft + pass(gamma+1) and yields tau tokens (1 <= tau <= gamma+1): "
             f"speed-up = tau x pass(1) / step. 'tau needed' reaches {target}x; above gamma + 1 (marked) no drafter "
             "can, at that gamma. 'all accepted' = the speed-up at tau = gamma + 1.\n",
             md_table(["dtype", "kernels", "drafter", "gamma", "draft ms", "step ms", "tau needed", "all accepted"],
                      [[r["dtype"], r["kernels"], r["drafter"], str(r["gamma"]), f"{r['draft_ms']:.2f}", f"{r['step_ms']:.1f}",
                        f"**{r['tau_needed']:.2f}**" + (" (> gamma+1)" if r["tau_needed"] > r["gamma"] + 1 else ""),
                        f"{r['best_speedup']:.2f}x"] for r in result["ceilings"]]) + "\n"]
    return "\n".join(parts)


def _cost(row: dict, k: int) -> float:
    return {int(key): value for key, value in row["pass_ms"].items()}[k]


def build_parser() -> benchlib.Parser:
    p = benchlib.script_parser(PROG, __doc__, kernels="fast,compiled")
    p.add_argument("--gammas", type=benchlib.number_list(int, "--gammas", 1), default="3,5,8",
                   help="comma-separated draft lengths (the compiled kind is tuned for the first)")
    p.add_argument("--rows", type=benchlib.number_list(int, "--rows", 1), default="1,2,3,4,6,9",
                   help="new tokens per timed pass, besides 1 and gamma + 1")
    p.add_argument("--reps", type=ranged(int, "--reps", lo=1), default=25, help="timed repetitions (median)")
    p.add_argument("--target", type=ranged(float, "--target", lo=1), default=1.8,
                   help="the speed-up over plain decoding that 'tau needed' is computed for")
    return p


def measure_all(args, ckpt) -> dict:
    """Pass costs and the tau needed, for every dtype and kernels kind asked for."""
    import minispec

    rows = tuple(sorted({1, *args.rows, *(g + 1 for g in args.gammas)}))
    [prompt] = benchlib.load_prompts(["summarization"], 1, minispec.load_tokenizer(ckpt))
    passes, ceilings = [], []
    for dtype_name in args.dtypes:
        for kernels in args.kernels:
            if not benchlib.runs_here(PROG, dtype_name, kernels):
                continue
            print(f"{PROG}: {dtype_name}, {kernels} ...", file=sys.stderr)
            p, c = measure(ckpt, getattr(torch, dtype_name), kernels, prompt.ids, args.gammas, rows, args.reps,
                           args.target)
            passes.append({"dtype": dtype_name, **p})
            ceilings += [{"dtype": dtype_name, **r} for r in c]
    return {"settings": {"gammas": list(args.gammas), "rows": list(rows), "reps": args.reps, "target": args.target},
            "passes": passes, "ceilings": ceilings}


def main(argv: list[str] | None = None) -> int:
    return benchlib.run_benchmark(PROG, argv, build_parser(), measure_all, render)


if __name__ == "__main__":
    sys.exit(main())
