"""Batched decoding: aggregate tok/s of plain and speculative decoding against the batch size.

    python scripts/speed/bench_batch.py [--sets summarization,rag] [--batch-sizes 1,2,4,8,16] [--max-new-tokens 64]
                                  [--drafts ngram@3,self:int8@8] [--policies exact,dropmatch:p=0.3]
                                  [--reps 2] [--threads 2] [--no-transformers]

Greedy (T = 0), float32 target on the fast kernels. A batch of size B is the first B prompts of
a Spec-Bench set (--sets); every row decodes exactly --max-new-tokens (eos ignored), so every
configuration does the same work. Per set and batch size, the configurations take turns
(benchlib.time_interleaved; a warm-up on short prompts first), --reps times:

    plain                       minispec.generate_batch without a draft: one [R, 1] pass per step
    SPEC gG POLICY              generate_batch with draft SPEC, gamma G (--drafts SPEC@G), each
                                rule of --policies (NAME[:key=value,...], as --policy takes it):
                                exact, dropmatch (every dropout path scored by the row's own
                                policy), dropmatch-lazy (extra head rows batched into the
                                verify's one head call)
    transformers                transformers' batched greedy generate: left padding, pad = eos

Numbers per configuration (medians over the repetitions): tok/s = every row's tokens over the
call's wall time (prefill included); decode tok/s = the tokens after each row's first over the
time after the batch's prefill (transformers: after its first token, timed by a streamer);
pooled tau (all committed tokens over all row-steps, the correction/bonus counted); the share of
the decode time spent drafting, verifying and deciding; ms per batched step, and "tau needed" =
that step over plain's step at the same B (the tau at which the configuration would tie plain);
"= plain" counts rows equal to plain decoding's at the same B (DropMatch is lossy at p > 0).
Speed-ups: over plain at B = 1 and over plain at the same B (decode tok/s, and end to end).
The DropMatch table is the paper's Table 5 analogue: DropMatch's decode tok/s over its base
(same draft, exact policy) at each B.

Then the cost of the verify pass itself: ms of one target pass (blocks + LM head on every row)
of [B, k] new tokens, k = 1 and each gamma + 1, every row on a cache of --context positions
(the prompts' median length if not given), median of 10 interleaved repetitions.

Writes bench_batch.json and .md to --out (default out/bench_batch/).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from minispec.kernels import measure as probe
from benchlib import fmt, md_table, median, ratio

import torch  # noqa: E402

from minispec.cli import ranged  # noqa: E402
from minispec.errors import MinispecError  # noqa: E402

PROG = "bench_batch"
POLICIES = ("exact", "dropmatch", "dropmatch-lazy")
DEFAULT_SETS = ("summarization", "rag")


@dataclass(frozen=True)
class Config:
    draft: str | None = None  # a drafter spec (minispec.chain.drafters.make_drafter); None: plain decoding
    gamma: int | None = None
    policy: benchlib.PolicySpec | None = None  # the acceptance rule
    transformers: bool = False

    @property
    def name(self) -> str:
        if self.transformers:
            return "transformers"
        return "plain" if self.draft is None else f"{self.draft} g{self.gamma} {self.policy.text}"


def parse_draft(text: str) -> tuple[str, int]:
    """'ngram@3' -> ('ngram', 3): a drafter spec and its gamma."""
    spec, at, gamma = text.strip().rpartition("@")
    if not at or not spec or not gamma.isdigit() or int(gamma) < 1:
        raise ValueError(text)
    return spec, int(gamma)


def draft_list(text: str) -> tuple[tuple[str, int], ...]:
    try:
        drafts = tuple(parse_draft(item) for item in text.split(",") if item.strip())
    except ValueError as bad:
        raise argparse.ArgumentTypeError(f"--drafts = {text!r}: {str(bad)!r} is not SPEC@GAMMA; "
                                         f"expected e.g. ngram@3,self:int8@8") from None
    if not drafts:
        raise argparse.ArgumentTypeError(f"--drafts = {text!r}; expected e.g. ngram@3,self:int8@8")
    return tuple(dict.fromkeys(drafts))


def up_to_list(text: str) -> dict[str, int]:
    """'dropmatch=4,transformers=8' -> {'dropmatch': 4, 'transformers': 8}."""
    limits = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        name, _, size = item.partition("=")
        if name not in POLICIES + ("transformers",) or not size.isdigit() or int(size) < 1:
            raise argparse.ArgumentTypeError(f"--up-to = {text!r}: {item!r}; expected NAME=B with NAME one of "
                                             f"{', '.join(POLICIES + ('transformers',))} and B >= 1")
        limits[name] = int(size)
    return limits


def runs_at(config: Config, batch_size: int, up_to: dict[str, int]) -> bool:
    """Whether --up-to lets this configuration run at this batch size (plain always runs)."""
    name = "transformers" if config.transformers else config.policy and config.policy.name
    return name is None or batch_size <= up_to.get(name, batch_size)


def configs(drafts, policies, transformers: bool) -> list[Config]:
    """plain, every draft with every policy, then transformers."""
    return ([Config()] + [Config(spec, gamma, policy) for spec, gamma in drafts for policy in policies]
            + ([Config(transformers=True)] if transformers else []))


# ------------------------------------------------------------------------------------ one call


class FirstTokenClock:
    """A transformers streamer that only notes when the first generated tokens arrive.

    generate calls put(prompt ids) once, then put(new tokens) after every step, then end()."""

    def __init__(self) -> None:
        self.puts, self.first = 0, None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def hf_generate_batch(hf, prompts: list[list[int]], max_new_tokens: int, pad_id: int) -> dict:
    """transformers' greedy generate on a left-padded batch, exactly max_new_tokens per row (eos
    suppressed by min_new_tokens, as benchlib.hf_generate does with eos = [])."""
    longest = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (longest - len(p)) + p for p in prompts])  # [B, T], left-padded
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])  # [B, T]
    clock = FirstTokenClock()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                          do_sample=False, pad_token_id=pad_id, streamer=clock)  # [B, T + N]
    seconds = time.perf_counter() - t0
    return {"tokens": out[:, longest:].tolist(), "seconds": seconds,
            "decode_seconds": None if clock.first is None else t0 + seconds - clock.first}


def minispec_batch(target, drafters: dict, config: Config, prompts: list[list[int]], max_new_tokens: int) -> dict:
    """generate_batch for one configuration: every row's tokens and the batch's stats."""
    from minispec.batch.speculative import generate_batch

    options = {}
    if config.draft is not None:
        options = {"draft": drafters[config.draft], "gamma": config.gamma, "policy": config.policy.build()}
    t0 = time.perf_counter()
    result = generate_batch(target, prompts, max_new_tokens=max_new_tokens, eos_token_ids=[], temperature=0.0,
                            seed=0, **options)
    seconds = time.perf_counter() - t0
    s = result.stats
    return {"tokens": [r.tokens for r in result], "seconds": seconds, "decode_seconds": s["total_seconds"] - s["prefill_seconds"],
            "prefill_seconds": s["prefill_seconds"], "passes": s["target_forwards"] - 1, "tau": s["tau"],
            "draft_seconds": s.get("draft_seconds"), "verify_seconds": s.get("verify_seconds"),
            "policy_seconds": s.get("policy_seconds"), "mean_rows_per_pass": s["mean_rows_per_pass"]}


def run_config(target, drafters: dict, hf, config: Config, prompts, max_new_tokens: int, pad_id: int) -> dict:
    if config.transformers:
        return hf_generate_batch(hf, prompts, max_new_tokens, pad_id)
    return minispec_batch(target, drafters, config, prompts, max_new_tokens)


# ------------------------------------------------------------------------------------ the runs


def bench_set(target, drafters: dict, hf, set_name: str, prompts: list[list[int]], batch_sizes, reps: dict,
              all_configs: list[Config], max_new_tokens: int, pad_id: int,
              up_to: dict[str, int] | None = None) -> list[dict]:
    """Per batch size B: a warm-up of every configuration on short prompts, then the configurations
    in turn on the first B prompts, reps[B] times. One record per (B, configuration)."""
    records = []
    for batch_size in batch_sizes:
        batch = prompts[:batch_size]
        config_list = [c for c in all_configs if runs_at(c, batch_size, up_to or {})]
        run = partial(run_config, target, drafters, hf, max_new_tokens=max_new_tokens, pad_id=pad_id)
        for config in config_list:  # new shapes pay one-time costs (oneDNN primitives, allocations) here
            run_config(target, drafters, hf, config, [p[:16] for p in batch], min(max_new_tokens, 12), pad_id)
        runs: dict[str, list[dict]] = {c.name: [] for c in config_list}
        load = benchlib.load_average()
        print(f"{PROG}: {set_name}, B = {batch_size}, {len(config_list)} configurations x {reps[batch_size]} "
              f"(load {load}) ...", file=sys.stderr)
        fns = {c.name: partial(_append, runs[c.name], run, c, batch) for c in config_list}
        seconds = benchlib.time_interleaved(fns, reps[batch_size], warmup=0)
        for config in config_list:
            records.append(record(set_name, batch_size, config, runs[config.name], seconds[config.name], load))
    return records


def _append(runs: list, run, config: Config, batch) -> None:
    runs.append(run(config, batch))


def record(set_name: str, batch_size: int, config: Config, runs: list[dict], seconds: float, load) -> dict:
    """One (set, B, configuration): medians over its runs; the tokens of the first (greedy: all alike)."""
    first = runs[0]
    generated = sum(map(len, first["tokens"]))
    decode = median(r["decode_seconds"] for r in runs)

    def share(key):
        return median(r[key] / r["decode_seconds"] for r in runs if r.get(key) is not None and r["decode_seconds"])

    def per_step(key):
        return median(1000 * r[key] / r["passes"] for r in runs if r.get(key) is not None and r.get("passes"))

    return {
        "set": set_name, "batch_size": batch_size, "config": config.name, "draft": config.draft, "gamma": config.gamma,
        "policy": config.policy and config.policy.text, "reps": len(runs), "load_average": load,
        "generated": generated, "tokens": first["tokens"], "tau": first.get("tau"),
        "seconds": seconds, "decode_seconds": decode,
        "rep_seconds": [r["seconds"] for r in runs], "rep_decode_seconds": [r["decode_seconds"] for r in runs],
        "prefill_seconds": median(r.get("prefill_seconds") for r in runs),
        "tps": generated / seconds, "decode_tps": ratio(generated - batch_size, decode),
        "draft_share": share("draft_seconds"), "verify_share": share("verify_seconds"),
        "policy_share": share("policy_seconds"),
        "step_ms": median(1000 * r["decode_seconds"] / r["passes"] for r in runs if r.get("passes")),
        "verify_ms": per_step("verify_seconds"), "draft_ms": per_step("draft_seconds"),
        "mean_rows_per_pass": first.get("mean_rows_per_pass"),
    }


def pass_costs(target, batch_sizes, widths, context: int, reps: int = 10) -> list[dict]:
    """ms of one target pass of [B, k] new tokens (minispec.kernels.measure.pass_costs: the blocks and
    the LM head on all B*k rows, as a verify scores them) with every row holding `context` positions
    of zeros (what they hold does not change the cost); the cache is rolled back after each pass."""
    from minispec.batch.ragged_cache import RaggedKVCache

    rows = []
    for batch_size in batch_sizes:
        cache = target.new_cache(batch_size, context + max(widths), cache_class=RaggedKVCache)
        cache.advance(context)
        ms = probe.pass_costs(target, cache, widths, rollback=partial(cache.truncate, [context] * batch_size),
                                batch_size=batch_size, reps=reps)
        row = {"batch_size": batch_size, "context": context, **{f"k{k}_ms": 1000 * ms[k] for k in widths}}
        for k in widths:
            row[f"k{k}_over_k1"] = ratio(ms[k], ms[widths[0]])
        rows.append(row)
        del cache
    return rows


# ---------------------------------------------------------------------------------- summaries


def summarise(records: list[dict]) -> list[dict]:
    """Every record with its speed-ups: over plain at B = 1 and over plain at the same B (decode
    tok/s and end to end), over transformers at the same B, "= plain" and tau needed."""
    rows = []
    for set_name in dict.fromkeys(r["set"] for r in records):
        group = [r for r in records if r["set"] == set_name]
        plain = {r["batch_size"]: r for r in group if r["config"] == "plain"}
        hf = {r["batch_size"]: r for r in group if r["config"] == "transformers"}
        plain_b1 = plain.get(1)
        for r in group:
            base, their = plain.get(r["batch_size"]), hf.get(r["batch_size"])
            rows.append({
                **{k: v for k, v in r.items() if k != "tokens"},
                "decode_vs_plain_b1": ratio(r["decode_tps"], plain_b1 and plain_b1["decode_tps"]),
                "tps_vs_plain_b1": ratio(r["tps"], plain_b1 and plain_b1["tps"]),
                "decode_vs_plain": ratio(r["decode_tps"], base and base["decode_tps"]),
                "tps_vs_plain": ratio(r["tps"], base and base["tps"]),
                "decode_vs_hf": ratio(r["decode_tps"], their and their["decode_tps"]),
                "tps_vs_hf": ratio(r["tps"], their and their["tps"]),
                "tau_needed": ratio(r["step_ms"], base and base["step_ms"]) if r["draft"] else None,
                "same_as_plain": None if base is None else sum(a == b for a, b in zip(r["tokens"], base["tokens"])),
            })
    return rows


def dropmatch_gains(rows: list[dict]) -> list[dict]:
    """The paper's Table 5 analogue: per set, draft and DropMatch form, at each B, DropMatch's
    decode tok/s (and tau, and end-to-end tok/s) over its base: the same draft with the exact policy."""
    exact = {(r["set"], r["draft"], r["gamma"], r["batch_size"]): r for r in rows if r["policy"] == "exact"}
    out = []
    for r in rows:
        base = exact.get((r["set"], r["draft"], r["gamma"], r["batch_size"]))
        if r["policy"] in (None, "exact") or base is None:
            continue
        out.append({"set": r["set"], "draft": r["draft"], "gamma": r["gamma"], "policy": r["policy"],
                    "batch_size": r["batch_size"], "decode_gain": ratio(r["decode_tps"], base["decode_tps"]),
                    "tps_gain": ratio(r["tps"], base["tps"]), "tau_gain": ratio(r["tau"], base["tau"]),
                    "policy_share": r["policy_share"]})
    return out


# ------------------------------------------------------------------------------------ markdown


def render(result: dict) -> str:
    s = result["settings"]
    parts = ["# minispec: batched decoding\n", benchlib.record_markdown(result["run"]),
             (f"Greedy, float32, fast kernels; {s['max_new_tokens']} new tokens per row (eos ignored); batch B = the "
             f"first B prompts of the set; repetitions per B: {', '.join(f'{b}: {n}' for b, n in s['reps'].items())} "
             f"(medians); only up to B: {s.get('up_to') or 'none'}. tok/s = all rows' tokens / wall time (prefill "
             "included); decode tok/s = the tokens after each row's first / time after the batch prefill. Load "
             "average per B in the JSON records.\n")]
    rows = result["rows"]
    for set_name in dict.fromkeys(r["set"] for r in rows):
        group = [r for r in rows if r["set"] == set_name]
        plain = [r for r in group if r["config"] == "plain"]
        hf = {r["batch_size"]: r for r in group if r["config"] == "transformers"}
        parts += [f"## {set_name}: plain decoding against the batch size\n",
                  md_table(["B", "tok/s", "vs B=1", "decode tok/s", "decode vs B=1", "prefill s", "ms/step",
                            "transformers tok/s", "decode tok/s", "ours / transformers", "decode ours / transformers",
                            "= transformers"],
                           [[str(r["batch_size"]), fmt(r["tps"], ".1f"), fmt(r["tps_vs_plain_b1"], ".2f", "x"),
                             fmt(r["decode_tps"], ".1f"), fmt(r["decode_vs_plain_b1"], ".2f", "x"),
                             fmt(r["prefill_seconds"], ".2f"), fmt(r["step_ms"], ".1f"),
                             fmt(hf.get(r["batch_size"], {}).get("tps"), ".1f"),
                             fmt(hf.get(r["batch_size"], {}).get("decode_tps"), ".1f"),
                             fmt(ratio(r["tps"], hf.get(r["batch_size"], {}).get("tps")), ".2f", "x"),
                             fmt(ratio(r["decode_tps"], hf.get(r["batch_size"], {}).get("decode_tps")), ".2f", "x"),
                             _same(hf.get(r["batch_size"]))] for r in plain]) + "\n",
                  f"## {set_name}: every configuration\n",
                  md_table(["B", "config", "tau", "tok/s", "decode tok/s", "vs plain B=1", "vs plain same B",
                            "e2e vs plain same B", "ms/step", "tau needed", "verify ms/step", "draft ms/step",
                            "draft / verify / policy share", "= plain"],
                           [[str(r["batch_size"]), r["config"], fmt(r["tau"]), fmt(r["tps"], ".1f"),
                             fmt(r["decode_tps"], ".1f"), fmt(r["decode_vs_plain_b1"], ".2f", "x"),
                             fmt(r["decode_vs_plain"], ".2f", "x"), fmt(r["tps_vs_plain"], ".2f", "x"),
                             fmt(r["step_ms"], ".1f"), fmt(r["tau_needed"]), fmt(r["verify_ms"], ".1f"),
                             fmt(r["draft_ms"], ".1f"),
                             " / ".join(fmt(r[k], ".0%") for k in ("draft_share", "verify_share", "policy_share"))
                             if r["draft"] else "–", _same(r)]
                            for r in sorted(group, key=lambda r: r["batch_size"])]) + "\n"]
    gains = result["dropmatch"]
    if gains:
        sizes = sorted({g["batch_size"] for g in gains})
        table = {}
        for g in gains:
            table.setdefault((g["set"], g["draft"], g["gamma"], g["policy"]), {})[g["batch_size"]] = g
        parts += ["## DropMatch over its base (same draft, exact policy): decode tok/s ratio (tau ratio)\n",
                  md_table(["set", "draft", "policy"] + [f"B={b}" for b in sizes],
                           [[st, f"{d} g{gm}", pol] + [f"{fmt(by[b]['decode_gain'], '.2f', 'x')} "
                                                      f"({fmt(by[b]['tau_gain'], '.2f', 'x')})" if b in by else "–"
                                                      for b in sizes]
                            for (st, d, gm, pol), by in table.items()]) + "\n"]
    costs = result["pass_costs"]
    if costs:
        widths = [int(k[1:-3]) for k in costs[0] if k.startswith("k") and k.endswith("_ms")]
        parts += [f"## One target pass of [B, k] new tokens, {costs[0]['context']} cached positions per row (ms)\n",
                  md_table(["B"] + [f"k={k} ms" for k in widths] + [f"k={k} / k=1" for k in widths[1:]]
                           + ["k=1 ms per row"],
                           [[str(c["batch_size"])] + [fmt(c[f"k{k}_ms"], ".1f") for k in widths]
                            + [fmt(c[f"k{k}_over_k1"], ".2f") for k in widths[1:]]
                            + [fmt(c[f"k{widths[0]}_ms"] / c["batch_size"], ".1f")] for c in costs]) + "\n"]
    return "\n".join(parts)


def _same(r: dict | None) -> str:
    if r is None or r.get("same_as_plain") is None:
        return "–"
    return f"{r['same_as_plain']}/{r['batch_size']}"


# ---------------------------------------------------------------------------------------- main


def build_parser() -> benchlib.Parser:
    p = benchlib.script_parser(PROG, __doc__, threads=False)
    p.add_argument("--threads", type=ranged(int, "--threads", lo=1), default=2, help="torch threads")
    p.add_argument("--sets", type=benchlib.name_list("--sets", benchlib.PROMPT_SETS), default=",".join(DEFAULT_SETS),
                   help="comma-separated prompt sets (benchlib.load_prompts)")
    p.add_argument("--batch-sizes", type=benchlib.number_list(int, "--batch-sizes", 1), default="1,2,4,8,16",
                   help="comma-separated batch sizes (the first is every ratio's 'B=1' baseline)")
    p.add_argument("--max-new-tokens", type=ranged(int, "--max-new-tokens", lo=2), default=64,
                   help="new tokens per row (eos ignored)")
    p.add_argument("--drafts", type=draft_list, default="ngram@3,self:int8@8",
                   help="comma-separated SPEC@GAMMA: a drafter (ngram, self:int8, self:bf16, early-exit:N, ...) and its gamma")
    p.add_argument("--policies", type=benchlib.policy_list("--policies", POLICIES),
                   default="exact,dropmatch:p=0.3,dropmatch-lazy:p=0.3",
                   help=f"comma-separated acceptance rules among {', '.join(POLICIES)}, each NAME[:key=value,...] as "
                        "python -m minispec.generate's --policy takes it, for every draft")
    p.add_argument("--reps", type=reps_list, default="2",
                   help="timed repetitions per batch size: one number, or one per batch size (repeats kept)")
    p.add_argument("--up-to", type=up_to_list, default="",
                   help="comma-separated NAME=B: run a rule named NAME (or transformers) only at batch sizes <= B")
    p.add_argument("--context", type=ranged(int, "--context", lo=1), default=None,
                   help="cached positions per row for the pass-cost table (if not given: the prompts' median length)")
    p.add_argument("--no-transformers", dest="transformers", action="store_false", help="leave transformers out")
    p.add_argument("--no-pass-costs", dest="pass_costs", action="store_false", help="skip the [B, k] pass-cost table")
    return p


def reps_list(text: str) -> tuple[int, ...]:
    """'3,3,2,1,1' -> (3, 3, 2, 1, 1): repeats kept (one per batch size), each >= 1."""
    try:
        values = tuple(int(item) for item in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--reps = {text!r}; expected comma-separated integers >= 1")
    return values


def reps_per_size(batch_sizes, reps) -> dict[int, int]:
    """{B: repetitions}: one number for every batch size, or one per batch size."""
    if len(reps) not in (1, len(batch_sizes)):
        raise MinispecError(f"--reps = {','.join(map(str, reps))}: {len(reps)} numbers; expected one, or one per "
                            f"batch size ({len(batch_sizes)})")
    return dict(zip(batch_sizes, reps * len(batch_sizes) if len(reps) == 1 else reps))


def run(args, ckpt: Path) -> dict:
    """Load the target (and drafts) on the fast kernels and transformers, then each set in turn."""
    import minispec

    reps = reps_per_size(args.batch_sizes, args.reps)
    tokenizer = minispec.load_tokenizer(ckpt)
    per_set = max(args.batch_sizes)
    prompts = {name: [p.ids for p in benchlib.load_prompts([name], per_set, tokenizer)] for name in args.sets}
    for name, ids in prompts.items():
        if len(ids) < per_set:
            raise MinispecError(f"--sets {name}: {len(ids)} prompts; --batch-sizes needs {per_set}")
    print(f"{PROG}: loading ...", file=sys.stderr)
    specs = list(dict.fromkeys(spec for spec, _ in args.drafts))
    loaded = benchlib.load_minispec(ckpt, torch.float32, "fast", drafters=specs)  # self-drafts, then kernels
    hf = benchlib.load_transformers(ckpt, torch.float32) if args.transformers else None
    config_list = configs(args.drafts, args.policies, hf is not None)
    pad_id = tokenizer.eos_token_ids[0]
    records = []
    with torch.inference_mode():
        for name, ids in prompts.items():
            records += bench_set(loaded.model, loaded.drafters, hf, name, ids, args.batch_sizes, reps, config_list,
                                 args.max_new_tokens, pad_id, args.up_to)
    costs = []
    if args.pass_costs:
        context = args.context or int(statistics.median(len(p) for ids in prompts.values() for p in ids))
        widths = [1] + sorted({gamma + 1 for _, gamma in args.drafts})
        print(f"{PROG}: pass costs ...", file=sys.stderr)
        costs = pass_costs(loaded.model, args.batch_sizes, widths, context)
    rows = summarise(records)
    return {"settings": {"sets": list(args.sets), "batch_sizes": list(args.batch_sizes), "reps": reps,
                         "max_new_tokens": args.max_new_tokens, "drafts": [f"{s}@{g}" for s, g in args.drafts],
                         "policies": [spec.text for spec in args.policies], "up_to": args.up_to,
                         "threads": torch.get_num_threads(),
                         "prompt_tokens": {name: [len(p) for p in ids] for name, ids in prompts.items()}},
            "rows": rows, "dropmatch": dropmatch_gains(rows), "pass_costs": costs, "records": records}


def main(argv: list[str] | None = None) -> int:
    return benchlib.run_benchmark(PROG, argv, build_parser(), run, render)


if __name__ == "__main__":
    sys.exit(main())
