"""What a streaming client learns from speculation's chunks, and what pacing leaves of it.

    python scripts/security/leakage.py [--ckpt CKPT] [--drafters ngram,early-exit:24,self:bf16]
        [--prompts 10] [--max-new-tokens 48] [--chunk 4]

A speculative step emits its accepted drafts and one more token at once, so a stream's chunk
sizes are the per-step accepted counts, and its gaps follow them. This script generates the
first --prompts prompts of each Spec-Bench category (six classes: mt_bench, translation,
summarization, qa, math_reasoning, rag; chance = 1/6), greedy, exact policy, a fixed
--max-new-tokens (no early stop, so the answer's length says nothing), and records when each
step's tokens became available. From each record it forms what a client sees (times from the
first token on: time to first token follows the prompt's length, not speculation):

    stream       every step's tokens as they come (today's streaming)
    paced@plain  minispec.lab.pacing.schedule: --chunk tokens per release, at the cadence of
                 plain decoding on this machine (median seconds per token over the prompts)
    paced@p10    the same at the 10th percentile of this drafter's own rates: faster, with stalls
                 on the slowest prompts
    whole        the whole answer at once

and, per view, features: the histogram of chunk sizes (1..gamma+1), their mean and spread
("counts": what the accepted counts alone give), and the gaps' mean, spread and quantiles and
the total time ("counts+timing"). A nearest-centroid classifier over standardised features
(fitted without the prompt it names: leave-one-out) and a 3-nearest-neighbour one give the
accuracy at naming a prompt's category. Plain decoding is the control: its chunks are single
tokens, so whatever it leaks comes from timing alone. The latency cost of a view is the median
over prompts of its last release's time over the stream's (1.00 = no cost).

Writes leakage.json and .md to --out (default out/leakage/).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from benchlib import fmt, md_table, median

import torch  # noqa: E402

from minispec.cli import ranged  # noqa: E402

PROG = "leakage"
CATEGORIES = benchlib.SPEC_BENCH_SETS  # six classes


def record_arrivals(model, ids: list[int], drafter, gamma: int, max_new: int) -> list[tuple[float, int]]:
    """[(seconds since the first token, tokens made available)] per step of one greedy generation."""
    from minispec.chain.speculative import generate_chain as generate

    arrivals: list[tuple[float, int]] = []
    options = {} if drafter is None else dict(draft=drafter, policy="exact", gamma=gamma)
    generate(model, ids, max_new_tokens=max_new, eos_token_ids=[],
             on_tokens=lambda tokens, n, g: arrivals.append((time.perf_counter(), len(tokens))), **options)
    start = arrivals[0][0]
    return [(t - start, c) for t, c in arrivals]


def features(releases: list[tuple[float, int]], gamma: int) -> dict[str, list[float]]:
    """'counts': size histogram (1..gamma+1, normalised), mean and std of sizes; 'counts+timing':
    those, and the gaps' mean, std, 10/50/90th percentiles and the total time."""
    sizes = [min(s, gamma + 1) for _, s in releases]
    hist = [sizes.count(k) / len(sizes) for k in range(1, gamma + 2)]
    m = sum(sizes) / len(sizes)
    counts = hist + [m, math.sqrt(sum((s - m) ** 2 for s in sizes) / len(sizes))]
    gaps = sorted(b[0] - a[0] for a, b in zip(releases, releases[1:])) or [0.0]
    g = sum(gaps) / len(gaps)
    q = [gaps[min(int(p * len(gaps)), len(gaps) - 1)] for p in (0.1, 0.5, 0.9)]
    timing = [g, math.sqrt(sum((x - g) ** 2 for x in gaps) / len(gaps)), *q, releases[-1][0]]
    return {"counts": counts, "counts+timing": counts + timing}


def standardise(train: list[list[float]], test: list[float]) -> tuple[list[list[float]], list[float]]:
    cols = list(zip(*train))
    mu = [sum(c) / len(c) for c in cols]
    sd = [math.sqrt(sum((x - m) ** 2 for x in c) / len(c)) or 1.0 for c, m in zip(cols, mu)]
    z = lambda row: [(x - m) / s for x, m, s in zip(row, mu, sd)]  # noqa: E731
    return [z(r) for r in train], z(test)


def loo_accuracy(X: list[list[float]], y: list[str]) -> dict[str, float]:
    """Leave-one-out accuracy of nearest centroid and of 3-nearest neighbours (Euclidean, standardised)."""
    hits = {"centroid": 0, "3-nn": 0}
    for i in range(len(X)):
        train, test = standardise(X[:i] + X[i + 1:], X[i])
        labels = y[:i] + y[i + 1:]
        dist = lambda a: math.dist(a, test)  # noqa: E731
        centroids = {c: [sum(col) / len(col) for col in zip(*[r for r, l in zip(train, labels) if l == c])]
                     for c in set(labels)}
        hits["centroid"] += min(centroids, key=lambda c: (dist(centroids[c]), c)) == y[i]
        nearest = sorted(range(len(train)), key=lambda j: (dist(train[j]), j))[:3]
        votes = [labels[j] for j in nearest]
        hits["3-nn"] += max(dict.fromkeys(votes), key=votes.count) == y[i]
    return {k: v / len(X) for k, v in hits.items()}


def views(arrivals: list[tuple[float, int]], chunk: int, intervals: dict[str, float]) -> dict[str, list]:
    from minispec.lab import pacing

    out = {"stream": arrivals}
    for name, interval in intervals.items():
        out[name] = pacing.schedule(arrivals, chunk, interval)
    out["whole"] = pacing.whole(arrivals)
    return out


def analyse(traces: dict[str, list[dict]], chunk: int, gamma: int) -> list[dict]:
    """Per drafter and view: accuracies and the latency cost."""
    plain = traces["plain"]
    plain_step = median(r["arrivals"][-1][0] / (sum(c for _, c in r["arrivals"]) - 1) for r in plain)
    rows = []
    for drafter, records in traces.items():
        rates = sorted((sum(c for _, c in r["arrivals"]) - 1) / r["arrivals"][-1][0] for r in records)
        intervals = {"paced@plain": chunk * plain_step,
                     "paced@p10": chunk / rates[int(0.1 * len(rates))]}
        per_view: dict[str, list] = {}
        for r in records:
            for name, releases in views(r["arrivals"], chunk, intervals).items():
                per_view.setdefault(name, []).append((r["set"], releases, r["arrivals"][-1][0]))
        for name, items in per_view.items():
            y = [s for s, _, _ in items]
            feats = [features(rel, gamma) for _, rel, _ in items]
            row = {"drafter": drafter, "view": name, "interval": intervals.get(name), "prompts": len(items),
                   "latency": median(rel[-1][0] / end for _, rel, end in items if end > 0)}
            for kind in ("counts", "counts+timing"):
                acc = loo_accuracy([f[kind] for f in feats], y)
                row[f"{kind} centroid"], row[f"{kind} 3-nn"] = acc["centroid"], acc["3-nn"]
            rows.append(row)
    return rows


def render(result: dict) -> str:
    s = result["settings"]
    intro = (f"{s['prompts']} prompts of each of {len(s['sets'])} Spec-Bench categories ({s['num_prompts']} in all; "
             f"chance = 1/{len(s['sets'])} = {1 / len(s['sets']):.1%}); T = 0, exact policy, gamma {s['gamma']}, "
             f"{s['max_new_tokens']} new tokens each; target {s['dtype']} {s['kernels']}; chunk {s['chunk']} tokens for "
             "the paced views. Accuracy = leave-one-out, nearest centroid / 3-nearest neighbours, over standardised "
             "features; latency = median over prompts of the last release's time over the stream's.\n")
    table = md_table(["drafter", "view", "interval", "counts: centroid / 3-nn", "counts+timing: centroid / 3-nn",
                      "latency"],
                     [[r["drafter"], r["view"], fmt(r["interval"], ".3f", " s"),
                       f"{r['counts centroid']:.0%} / {r['counts 3-nn']:.0%}",
                       f"{r['counts+timing centroid']:.0%} / {r['counts+timing 3-nn']:.0%}",
                       fmt(r["latency"], ".2f", "x")] for r in result["rows"]])
    return "\n".join(["# minispec: what accepted counts leak\n", benchlib.record_markdown(result["run"]), intro,
                      table + "\n"])


def build_parser() -> benchlib.Parser:
    p = benchlib.add_speculation_flags(benchlib.script_parser(PROG, __doc__))
    p.add_argument("--prompts", type=ranged(int, "--prompts", lo=2, hi=40), default=10,
                   help="prompts per category (at least 2: leave-one-out needs another of its class)")
    p.add_argument("--max-new-tokens", type=ranged(int, "--max-new-tokens", lo=4, hi=4096), default=48,
                   help="new tokens per generation (all of them: no early stop)")
    p.add_argument("--chunk", type=ranged(int, "--chunk", lo=1, hi=4096), default=4, help="tokens per paced release")
    return p


def run(args, ckpt: Path) -> dict:
    import minispec

    drafter_specs = benchlib.speculation(PROG, args)
    tokenizer = minispec.load_tokenizer(ckpt)
    prompts = benchlib.load_prompts(CATEGORIES, args.prompts, tokenizer)
    loaded = benchlib.load_minispec(ckpt, getattr(torch, args.dtype), args.kernels, drafters=drafter_specs)
    drafters = {"plain": None, **loaded.drafters}
    traces: dict[str, list[dict]] = {name: [] for name in drafters}
    with torch.inference_mode():
        for drafter in drafters.values():  # warm-up
            record_arrivals(loaded.model, prompts[0].ids, drafter, args.gamma, 8)
        for k, prompt in enumerate(prompts):  # every drafter on one prompt, then the next
            for name, drafter in drafters.items():
                arrivals = record_arrivals(loaded.model, prompt.ids, drafter, args.gamma, args.max_new_tokens)
                traces[name].append({"set": prompt.set, "prompt": prompt.index, "arrivals": arrivals})
            print(f"{PROG}: {k + 1}/{len(prompts)} prompts", file=sys.stderr)
    return {"settings": {"sets": list(CATEGORIES), "prompts": args.prompts, "num_prompts": len(prompts),
                         "gamma": args.gamma, "max_new_tokens": args.max_new_tokens, "chunk": args.chunk,
                         "drafters": drafter_specs, "dtype": args.dtype, "kernels": args.kernels},
            "rows": analyse(traces, args.chunk, args.gamma), "traces": traces}


def main(argv: list[str] | None = None) -> int:
    return benchlib.run_benchmark(PROG, argv, build_parser(), run, render)


if __name__ == "__main__":
    sys.exit(main())
