"""DropMatch's extra cost per verify step, "dropmatch" and "dropmatch-lazy", on replayed real verify steps.

    python scripts/dropmatch/bench_dropmatch_cost.py [--dtypes float32,bfloat16] [--kernels fast,compiled] [--prompts 4]

DropMatch adds work to every verify step: K dropout paths through the LM head (extra head rows)
and the JS test and vote. Timing it inside a loop would mix it with everything else, so:

1. Record: an exact-policy n-gram run (T = 0, gamma --gamma, up to --max-new-tokens or eos) on
   each Spec-Bench RAG prompt, with a recording exact policy that keeps every verify step's
   input: the LM-head input `hidden` [gamma+1, d] and the policy input (drafts, q, p).
2. Replay each recorded step, the variants taking turns, --reps times (median per step):
     exact      head(hidden) + the exact decision: what the run's own verify step did after
                its forward;
     a variant  what the loop does for that policy: head(hidden), then the policy's decision
                (which calls the head again on the dropped-out rows it needs).
   Variants: "dropmatch" (Algorithm 1 in full: all K paths at every position in one head call)
   and "dropmatch-lazy" (paths only at the positions whose verdict needs them). Same decisions in
   both.
3. Report, per variant: extra ms per step = (variant - exact), summed over all steps of all
   prompts, over the number of steps; the extra as a share of the runs' own verify time
   (forward + head, from their stats); for the lazy variants, positions per step whose verdict
   needed their paths and extra head calls per step (from Decision.info).

The runs use --kernels' kinds of minispec.kernels (the compiled kind compiled for the verify's
gamma + 1 rows before any timing). Writes bench_dropmatch_cost.json and .md to --out
(default out/bench_dropmatch_cost/).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from benchlib import fmt, md_table

import torch  # noqa: E402

from minispec import acceptance  # noqa: E402
from minispec.acceptance import ExactMatch, VerifyInput  # noqa: E402
from minispec.cli import ranged  # noqa: E402

PROG = "bench_dropmatch_cost"
VARIANTS = {  # label -> (registered name, options)
    "dropmatch": ("dropmatch", {}),
    "dropmatch-lazy": ("dropmatch-lazy", {}),
}


class RecordingExact(ExactMatch):
    """The exact policy, keeping every verify step's input (its `hidden` copied) for replay."""

    def __init__(self) -> None:
        self.steps: list[VerifyInput] = []

    def decide(self, inp: VerifyInput) -> acceptance.Decision:
        self.steps.append(VerifyInput(inp.draft_tokens, inp.q_draft, inp.target_logits, inp.p_target, inp.params,
                                      inp.generator, inp.draft_logits, hidden=inp.hidden.clone(), head=inp.head))
        return super().decide(inp)


def verify_step(policy: acceptance.AcceptancePolicy, step: VerifyInput) -> acceptance.Decision:
    """What the loop does after the verify's forward: the head over the clean rows, then the
    decision. (p_target is reused: it is the same for all.)"""
    hidden, head = step.hidden, step.head  # [g+1, d]
    logits = head(hidden)  # [g+1, V]
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    return policy(VerifyInput(step.draft_tokens, step.q_draft, logits, step.p_target, step.params, step.generator,
                              step.draft_logits, hidden=hidden, head=head))


def replay_costs(model, prompts: list[list[int]], gamma: int, max_new_tokens: int, eos: list[int],
                 p: float = 0.3, paths: int = 5, reps: int = 3) -> list[dict]:
    """One row per variant: DropMatch's extra time per verify step on the recorded steps of
    exact-policy n-gram runs over `prompts` (module docstring)."""
    from minispec.chain.speculative import generate_chain as generate

    names = ["exact", *VARIANTS]
    totals = dict.fromkeys(names, 0.0)
    positions, head_calls = dict.fromkeys(VARIANTS, 0.0), dict.fromkeys(VARIANTS, 0.0)
    verify_seconds, steps = 0.0, 0
    with torch.inference_mode():
        for ids in prompts:
            recorder = RecordingExact()
            out = generate(model, ids, max_new_tokens=max_new_tokens, draft="ngram", policy=recorder, gamma=gamma,
                           eos_token_ids=eos)
            verify_seconds += out.stats["verify_seconds"]
            steps += len(recorder.steps)
            policies = {"exact": acceptance.get("exact")}
            policies.update({label: acceptance.get(name, p=p, paths=paths, **options)
                             for label, (name, options) in VARIANTS.items()})
            for step in recorder.steps:
                infos = {label: [] for label in VARIANTS}

                def replay(label, step=step):
                    decision = verify_step(policies[label], step)
                    if label in infos:
                        infos[label].append(decision.info)

                seconds = benchlib.time_interleaved({label: (lambda label=label: replay(label)) for label in names},
                                                    reps, warmup=0)
                for label in names:
                    totals[label] += seconds[label]
                for label, runs in infos.items():
                    positions[label] += sum(i.get("path_positions", 0) for i in runs) / len(runs)
                    head_calls[label] += sum(i.get("path_head_calls", 0) for i in runs) / len(runs)
    per_step = lambda total: total / steps if steps else None  # noqa: E731
    rows = []
    for label, (name, _) in VARIANTS.items():
        extra = totals[label] - totals["exact"]
        lazy = name == "dropmatch-lazy"
        rows.append({"variant": label, "drafter": "ngram", "gamma": gamma, "prompts": len(prompts), "steps": steps,
                     "verify_ms_per_step": per_step(1e3 * verify_seconds), "extra_ms_per_step": per_step(1e3 * extra),
                     "extra_share": benchlib.ratio(extra, verify_seconds),
                     "path_positions_per_step": per_step(positions[label]) if lazy else None,
                     "path_head_calls_per_step": per_step(head_calls[label]) if lazy else None})
    return rows


def render(result: dict) -> str:
    s = result["settings"]
    return "\n".join([
        "# minispec: what DropMatch adds to a verify step\n", benchlib.record_markdown(result["run"]),
        f"DropMatch p={s['p']}, K={s['paths']}; exact-policy n-gram runs at gamma {s['gamma']} on {s['prompts']} "
        f"Spec-Bench RAG prompt(s), up to {s['max_new_tokens']} new tokens; every verify step replayed {s['reps']} "
        "times per variant (median). 'extra' = the variant's head call and decision minus exact's, per step; "
        "'/ verify' = over the runs' own verify time (forward + head). 'positions' = positions per step whose "
        "verdict needed their dropout paths; 'head calls' = extra LM-head calls per step (lazy only).\n",
        md_table(["dtype", "kernels", "variant", "steps", "verify ms/step", "extra ms/step", "positions/step",
                  "head calls/step", "extra / verify"],
                 [[r["dtype"], r["kernels"], r["variant"], str(r["steps"]), fmt(r["verify_ms_per_step"], ".1f"),
                   fmt(r["extra_ms_per_step"], ".2f"), fmt(r["path_positions_per_step"]),
                   fmt(r["path_head_calls_per_step"]), f"**{fmt(r['extra_share'], '.1%')}**"] for r in result["rows"]]),
        ""])


def build_parser() -> benchlib.Parser:
    p = benchlib.script_parser(PROG, __doc__, kernels="fast,compiled")
    p.add_argument("--prompts", type=ranged(int, "--prompts", lo=1), default=4, help="Spec-Bench RAG prompts")
    p.add_argument("--gamma", type=ranged(int, "--gamma", lo=1), default=5, help="draft length of the recorded runs")
    p.add_argument("--max-new-tokens", type=ranged(int, "--max-new-tokens", lo=1), default=128,
                   help="most new tokens of each recorded run (stops at eos)")
    p.add_argument("--reps", type=ranged(int, "--reps", lo=1), default=3, help="replays of each step per variant")
    p.add_argument("--dropout-p", type=ranged(float, "--dropout-p", lo=0, hi=1, hi_open=True), default=0.3,
                   help="DropMatch p")
    p.add_argument("--paths", type=ranged(int, "--paths", lo=1), default=5, help="DropMatch K")
    return p


def measure(args, ckpt) -> dict:
    """The replay for every dtype and kernels kind asked for: settings and rows."""
    import minispec

    tokenizer = minispec.load_tokenizer(ckpt)
    prompts = [p.ids for p in benchlib.load_prompts(["rag"], args.prompts, tokenizer)]
    rows = []
    for dtype_name in args.dtypes:
        for kernels in args.kernels:
            if not benchlib.runs_here(PROG, dtype_name, kernels):
                continue
            print(f"{PROG}: {dtype_name}, {kernels} ...", file=sys.stderr)
            model = benchlib.load_minispec(ckpt, getattr(torch, dtype_name), kernels,
                                           verify_rows=(args.gamma + 1,)).model
            rows += [{"dtype": dtype_name, "kernels": kernels, **r}
                     for r in replay_costs(model, prompts, args.gamma, args.max_new_tokens,
                                           list(tokenizer.eos_token_ids), args.dropout_p, args.paths, args.reps)]
            del model
    return {"settings": {"p": args.dropout_p, "paths": args.paths, "gamma": args.gamma, "prompts": len(prompts),
                         "max_new_tokens": args.max_new_tokens, "reps": args.reps},
            "rows": rows}


def main(argv: list[str] | None = None) -> int:
    return benchlib.run_benchmark(PROG, argv, build_parser(), measure, render)


if __name__ == "__main__":
    sys.exit(main())
