"""The acceptance rules side by side: one table and its Pareto figure (tau gain against quality change).

    python scripts/rules/rules_table.py [--pair out/rules_pair/bench_humaneval.json]
                                  [--chains out/rules_smollm2/bench_policies.json ...]
                                  [--trees out/rules_smollm2_trees/bench_tree_rules.json ...]
                                  [--out out/rules_table] [--png docs/img/rules_pareto.png]
                                  [--png-distortion docs/img/rules_distortion.png]

Reads what the benchmarks wrote and measures nothing itself:

  --pair      scripts/rules/bench_humaneval.py on the real pair (HumanEval pass@1 by execution). Each
              configuration is compared with `sampling-gG` at its own gamma G (at T = 0:
              `exact-gG`): tau gain, pass@1 difference with its paired bootstrap 95% interval
              (the same problems resampled), throughput over the base's on the same batches
              (median over batches).
  --chains    one or more scripts/rules/bench_policies.py results, on any target (SmolLM2, the pair;
              e.g. a second run at the calibrated DropMatch p); each chain configuration is compared
              with the base at the same target, drafter, gamma and temperature (sampling at T > 0,
              exact at T = 0) on the same prompts:
              tau gain (pooled), the target's NLL per token and the token agreement with plain
              greedy, each with its paired bootstrap 95% interval over prompts, and the median
              over prompts of the speed-up over plain decoding divided by the base's.
  --trees     scripts/rules/bench_tree_rules.py results: its rows as it reports them (against tree
              sampling).

The figure: one panel for the pair's pass@1 and one per --chains target, every chain configuration
a point, x = quality change (pass@1 points; NLL per token for --chains, where lower is better, so
the x axis is -dNLL: right is better in both), y = tau gain over its base, bars = the 95% interval
of the quality change. Lossless rules sit at x = 0 up to chance. The distortion figure
(--png-distortion): the --chains rows against the mean TV distance of the distribution each rule
emits at a judged position from the target's (bench_policies' distortion columns), one panel per
target and temperature: lossless rules sit at x = 0 exactly, not up to chance. Writes
rules_table.md and .json to --out; the figures need matplotlib.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
import humaneval_harness as harness
from benchlib import fmt, md_table, median

from minispec.cli import run_main  # noqa: E402
from minispec.errors import MinispecError  # noqa: E402

PROG = "rules_table"
LOSSLESS = ("exact", "sampling", "block", "traversal", "multipath")


# ------------------------------------------------------------------------------------- the pair


def pair_rows(result: dict) -> list[dict]:
    """One row per configuration of a bench_humaneval result, against sampling-gG (T > 0) or exact-gG."""
    import bench_humaneval

    temperature = result.get("temperature", 0)
    seeds = result.get("seeds", [0])
    by = {(r["config"], r.get("seed"), r["task_id"]): r for r in result["records"]}
    tasks = result["task_ids"]
    rows = []
    for name in result["configs"]:
        config = bench_humaneval.parse_config(name)
        if config["gamma"] is None:
            continue
        base = f"{'sampling' if temperature > 0 else 'exact'}-g{config['gamma']}" + (
            "@ngram" if config["drafter"] == "ngram" else "")
        if base not in result["configs"]:
            continue
        mine = bench_humaneval.summarize({**result, "base": base})
        row = next(r for r in mine if r["config"] == name)
        base_row = next(r for r in mine if r["config"] == base)
        solved = lambda n: [sum(by[(n, s, t)]["passed"] for s in seeds) / len(seeds) for t in tasks]  # noqa: E731
        rows.append({"model": "pair", "rule": name.split("-g")[0], "config": name, "gamma": config["gamma"],
                     "temperature": temperature, "base": base, "tau": row["tau"],
                     "tau_gain": row["tau"] / base_row["tau"] - 1 if row["tau"] and base_row["tau"] else None,
                     "acceptance": row["acceptance"], "quality": row["pass_at_1"],
                     "quality_change": list(harness.paired_bootstrap(solved(name), solved(base))),
                     "speed_vs_base": row["vs_base_speed_median"], "policy_share": row["policy_share"],
                     "prompts": len(tasks)})
    return rows


# --------------------------------------------------------- chains on any target (bench_policies)


def rule_of(record: dict) -> str:
    """A chain rule's short name: its registered name, then its options' values (lenience-0.5, fly-3);
    DropMatch as dropmatch-P, its criterion named unless it is the paper's (js_or_majority)."""
    from minispec import acceptance

    options = dict(record.get("options") or ())
    if record["policy"] in ("dropmatch", "dropmatch-lazy"):
        built = acceptance.get(record["policy"], **options)
        return f"dropmatch-{built.p:g}" + ("" if built.criterion == "js_or_majority" else f"-{built.criterion}")
    return "-".join([record["policy"], *(f"{v:g}" if isinstance(v, float) else str(v) for v in options.values())])


def chain_rows(results: list[dict]) -> list[dict]:
    """Chain configurations of bench_policies results, each against the base of its own run (same
    target, prompts and machine state); a configuration in two runs (a base repeated beside a new
    rule) is reported once, from the first run that has it."""
    rows, seen = [], set()
    for result in results:
        for row in run_rows(result):
            key = (row["model"], row["drafter"], row["gamma"], row["temperature"], row["rule"])
            if key not in seen:
                seen.add(key)
                rows.append(row)
    order = {model: i for i, model in enumerate(models_of(rows))}  # targets in the order given
    return sorted(rows, key=lambda r: (order[r["model"]], r["drafter"], r["gamma"], r["temperature"]))


def target_of(result: dict) -> str:
    """The target checkpoint's name from the run record (results without one came from SmolLM2)."""
    return ((result.get("run") or {}).get("checkpoint") or {}).get("name") or "smollm2-135m-instruct"


def run_rows(result: dict) -> list[dict]:
    """The chain configurations of one bench_policies result, against its base."""
    model = target_of(result)
    records = [r for r in result["records"] if r["tool"] == "minispec" and r["drafter"]]
    groups: dict[tuple, dict[str, dict]] = {}  # (drafter, gamma, T) -> rule -> {prompt: record}
    for r in records:
        groups.setdefault((r["drafter"], r["gamma"], r["temperature"]), {}).setdefault(rule_of(r), {})[
            (r["set"], r["prompt_index"])] = r
    rows = []
    for (drafter, gamma, temperature), rules in sorted(groups.items()):
        base_name = "sampling" if temperature > 0 else "exact"
        base = rules.get(base_name)
        if base is None:
            continue
        base_tau = pooled_tau(list(base.values()))
        for rule, mine in rules.items():
            prompts = [k for k in mine if k in base]
            tau = pooled_tau([mine[k] for k in prompts])
            nll = [(mine[k]["nll"], base[k]["nll"]) for k in prompts
                   if mine[k].get("nll") is not None and base[k].get("nll") is not None]
            agree = [(mine[k]["agree_overall"], base[k]["agree_overall"]) for k in prompts
                     if mine[k].get("agree_overall") is not None and base[k].get("agree_overall") is not None]
            drafted = sum(mine[k]["num_drafted"] or 0 for k in prompts)
            rows.append({
                "model": model, "rule": rule, "config": f"{rule} g{gamma}", "drafter": drafter, "gamma": gamma,
                "temperature": temperature, "base": base_name, "tau": tau,
                "tau_gain": tau / base_tau - 1 if tau and base_tau else None,
                "acceptance": sum(mine[k]["num_accepted"] or 0 for k in prompts) / drafted if drafted else None,
                "quality": sum(a for a, _ in nll) / len(nll) if nll else None,
                "quality_change": benchlib.paired_mean_interval([a for a, _ in nll], [b for _, b in nll]),
                "agreement": sum(a for a, _ in agree) / len(agree) if agree else None,
                "agreement_change": benchlib.paired_mean_interval([a for a, _ in agree], [b for _, b in agree]),
                "speed_vs_base": median(mine[k]["speedup"] / base[k]["speedup"] for k in prompts
                                        if mine[k].get("speedup") and base[k].get("speedup")),
                "policy_share": median(mine[k].get("policy_share") for k in prompts
                                       if mine[k].get("policy_share") is not None),
                **distortion_of([mine[k] for k in prompts]),
                "prompts": len(prompts)})
    return rows


def distortion_of(records: list[dict]) -> dict:
    """TV mean and 95th percentile and mean finite KL over every judged position of the records
    (bench_policies' per-position distortion lists), with the kind of figure; {} where none."""
    tv = [v for r in records for v in r.get("distortion_tv") or []]
    if not tv:
        return {}
    measured = []  # KL per position: a number, or inf (JSON: "inf", or null where the figure is not a bound)
    for r in records:
        bound = "bound" in (r.get("distortion_kind") or "")
        for v in r.get("distortion_kl") or []:
            if v is None or v != v:  # null: inf written through benchlib.finite, or a bound's unmeasured KL
                if not bound:
                    measured.append(float("inf"))
            else:
                measured.append(float(v))
    kl = [v for v in measured if v != float("inf")]
    kinds = sorted({k for r in records for k in (r.get("distortion_kind") or "").split("/") if k})
    ordered = sorted(tv)
    return {"tv_mean": sum(tv) / len(tv), "tv_p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
            "kl_mean": sum(kl) / len(kl) if kl else None, "distortion_kind": "/".join(kinds),
            "kl_infinite_share": (len(measured) - len(kl)) / len(measured) if measured else None}


def pooled_tau(records: list[dict]) -> float | None:
    steps = sum(r["verify_steps"] or 0 for r in records)
    return (sum(r["num_accepted"] or 0 for r in records) + steps) / steps if steps else None


# ----------------------------------------------------------------------------------------- output


def interval(values: list[float] | None, scale: float = 1.0, spec: str = "+.1f") -> str:
    if values is None:
        return "–"
    a, lo, hi = (v * scale for v in values)
    return f"{a:{spec}} [{lo:{spec}}, {hi:{spec}}]"


def render(pair: list[dict], chains: list[dict], trees: list[dict]) -> str:
    text = ""
    if pair:
        text += "### The real pair: HumanEval pass@1 by execution\n\n" + md_table(
            ["T", "gamma", "rule", "tau", "tau gain", "acceptance", "pass@1", "vs base (points) [95% CI]",
             "x base (median batch)", "policy time"],
            [[fmt(r["temperature"], "g"), str(r["gamma"]), r["rule"], fmt(r["tau"]), fmt_gain(r["tau_gain"]),
              fmt(r["acceptance"]), f"{r['quality'] * 100:.1f}%", interval(r["quality_change"], 100),
              fmt(r["speed_vs_base"], ".2f", "x"), fmt(r["policy_share"], ".1%")] for r in pair]) + "\n\n"
    for model in models_of(chains):
        text += f"### {model}: distortion, the target's NLL and agreement with greedy\n\n" + md_table(
            ["T", "gamma", "drafter", "rule", "tau", "tau gain", "acceptance", "TV mean", "TV p95", "KL",
             "NLL", "vs base [95% CI]", "agreement", "vs base [95% CI]", "x base (median)", "prompts"],
            [[fmt(r["temperature"], "g"), str(r["gamma"]), r["drafter"], r["rule"], fmt(r["tau"]),
              fmt_gain(r["tau_gain"]), fmt(r["acceptance"]), *distortion_cells(r), fmt(r["quality"], ".3f"),
              interval(r["quality_change"], 1, "+.3f"), fmt(r["agreement"], ".2f"),
              interval(r["agreement_change"], 1, "+.2f"), fmt(r["speed_vs_base"], ".2f", "x"), str(r["prompts"])]
             for r in chains if r["model"] == model]) + "\n\n"
    for result in trees:
        import bench_tree_rules

        target = result["settings"].get("target", "smollm2-135m-instruct")
        text += f"### {target} on draft trees (T > 0)\n\n" + bench_tree_rules.table(result)
    return text


def models_of(rows: list[dict]) -> list[str]:
    """The targets of the rows, in order of first appearance."""
    return list(dict.fromkeys(r["model"] for r in rows))


def distortion_cells(row: dict) -> list[str]:
    """TV mean, TV p95, KL: "<=" where the figure is FLy's bound, "~" where it is a Monte Carlo estimate."""
    if row.get("tv_mean") is None:
        return ["–", "–", "–"]
    kind = row.get("distortion_kind") or ""
    mark = "<=" if "bound" in kind else "~" if "monte-carlo" in kind else ""
    kl = fmt(row.get("kl_mean"), ".4f")
    if row.get("kl_infinite_share"):  # positions where the rule gives a token of p's no mass
        kl += f" (inf at {row['kl_infinite_share']:.0%})"
    return [f"{mark}{row['tv_mean']:.4f}", f"{mark}{row['tv_p95']:.4f}", kl]


def plot_distortion(chains: list[dict], png: Path) -> Path:
    """tau gain against the mean TV distance from the target, one panel per target and temperature."""
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    measured = [r for r in chains if r.get("tv_mean") is not None and r["tau_gain"] is not None]
    order = {model: i for i, model in enumerate(models_of(measured))}
    panels = sorted({(r["model"], r["temperature"]) for r in measured}, key=lambda k: (order[k[0]], k[1]))
    columns = len({t for _, t in panels})
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6.5 * columns, 5 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (model, temperature) in zip(axes.flat, panels):
        mine = [r for r in measured if r["model"] == model and r["temperature"] == temperature]
        for r in mine:
            marker = "o" if r["gamma"] <= 5 else "s"
            color = "tab:blue" if r["rule"] in LOSSLESS else "tab:red"
            if r["rule"] == "exact" and temperature > 0:
                color = "tab:red"  # exact match is greedy: lossless at T = 0 only
            bound = "bound" in (r.get("distortion_kind") or "")
            ax.plot(r["tv_mean"], r["tau_gain"] * 100, marker=marker, color=color, mfc="none" if bound else color,
                    ls="none")
            ax.annotate(f"{r['rule']} g{r['gamma']}" + (" (<=)" if bound else ""), (r["tv_mean"], r["tau_gain"] * 100),
                        fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axvline(0, color="grey", lw=0.5)
        ax.axhline(0, color="grey", lw=0.5)
        drafters = ", ".join(sorted({r["drafter"] for r in mine}))
        ax.set_title(f"{model}, draft {drafters}, T = {temperature:g}", fontsize=9)
        ax.set_xlabel("mean TV distance from the target per judged position")
        ax.set_ylabel("tau gain over the base (%)")
    fig.text(0.01, 0.005, "blue: lossless, red: lossy; circles gamma 5, squares gamma 10; hollow: an upper bound "
             "on TV (FLy); the base is exact at T = 0, sampling at T = 1", fontsize=8)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    return png


def fmt_gain(gain: float | None) -> str:
    return "–" if gain is None else f"{gain * 100:+.1f}%"


def plot(pair: list[dict], chains: list[dict], png: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    panels = [("the real pair, HumanEval (T = 1)", "pass@1 change (points)", pair, 100.0)] + [
        (f"{model}, draft {', '.join(sorted({r['drafter'] for r in chains if r['model'] == model}))}",
         "-(NLL change) per token (right = more likely)", [r for r in chains if r["model"] == model], -1.0)
        for model in models_of(chains)]
    panels = [p for p in panels if p[2]]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 5), squeeze=False)
    for ax, (title, xlabel, rows, scale) in zip(axes[0], panels):
        for r in rows:
            if r["tau_gain"] is None or r["quality_change"] is None or r["rule"].endswith(("-majority", "-naive")):
                continue  # DropMatch's other criteria: in the table, not the figure (the paper's rule is js_or_majority)
            x, lo, hi = (v * scale for v in r["quality_change"])
            lo, hi = min(lo, hi), max(lo, hi)
            marker = "o" if r["gamma"] <= 5 else "s"
            color = "tab:blue" if r["rule"] in LOSSLESS else "tab:red"
            ax.errorbar(x, r["tau_gain"] * 100, xerr=[[x - lo], [hi - x]], fmt=marker, color=color,
                        alpha=0.5 if r["temperature"] == 0 else 1.0, capsize=2)
            ax.annotate(f"{r['rule']} g{r['gamma']}" + (" T0" if r["temperature"] == 0 and r["model"] != "pair" else ""),
                        (x, r["tau_gain"] * 100), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axvline(0, color="grey", lw=0.5)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("tau gain over the base (%)")
    fig.text(0.01, 0.01, "blue: lossless, red: lossy; circles gamma 5, squares gamma 10; faded: T = 0; "
             "bars: paired 95% interval; DropMatch: the paper's criterion (js_or_majority)", fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    return png


def main(argv=None) -> int:
    parser = benchlib.Parser(prog=PROG, description=__doc__.strip().splitlines()[0])
    parser.add_argument("--pair", type=Path, nargs="*", default=[], help="bench_humaneval.json files")
    parser.add_argument("--chains", type=Path, nargs="*", default=[],
                        help="bench_policies.json files (any target; each row labelled by its target)")
    parser.add_argument("--trees", type=Path, nargs="*", default=[], help="bench_tree_rules.json files")
    parser.add_argument("--out", type=benchlib.out_folder("--out"), default=None, help=f"output folder (if not given: out/{PROG}/)")
    parser.add_argument("--png", type=Path, default=None, help="the figure (if not given: none)")
    parser.add_argument("--png-distortion", type=Path, default=None,
                        help="tau gain against distortion, from --chains results that measured it (if not given: none)")
    args = parser.parse_args(argv)

    def body() -> int:
        if not (args.pair or args.chains or args.trees):
            raise MinispecError("nothing to tabulate; expected --pair, --chains or --trees with result files")
        pair = [row for path in args.pair for row in pair_rows(benchlib.read_result(path, "--pair", "bench_humaneval",
                                                                                    ("records", "task_ids", "configs")))]
        chains = chain_rows([benchlib.read_result(path, "--chains", "bench_policies", ("records", "settings"))
                             for path in args.chains])
        trees = [benchlib.read_result(path, "--trees", "bench_tree_rules") for path in args.trees]
        text = render(pair, chains, trees)
        out = benchlib.out_dir(PROG, args.out)
        benchlib.write_outputs(out, PROG, {"pair": pair, "chains": chains}, text)
        if args.png is not None:
            print(f"{PROG}: wrote {plot(pair, chains, args.png)}", file=sys.stderr)
        if args.png_distortion is not None:
            if not any(r.get("tv_mean") is not None for r in chains):
                raise MinispecError("--png-distortion: no --chains result measured distortion; expected a "
                                    "bench_policies.json with distortion columns")
            print(f"{PROG}: wrote {plot_distortion(chains, args.png_distortion)}", file=sys.stderr)
        print(text)
        return 0

    return run_main(PROG, body)


if __name__ == "__main__":
    raise SystemExit(main())
