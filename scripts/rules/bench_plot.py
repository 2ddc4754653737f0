"""The plot of scripts/rules/bench_policies.py's result: tau, speed-up and quality of every configuration.

    python scripts/rules/bench_plot.py [out/bench_policies/bench_policies.json] [--png PATH]

bench_policies.py calls `plot(result, path)` itself at the end of a run; this command redraws
the figure from a saved result. The figure:

    row 1   tau against gamma, one panel per drafter, one line per policy
    row 2   speed-up over plain decoding against gamma, the same layout
    row 3   quality against tau, every speculative config as a point: the target's NLL of the
            output (left) and token agreement with plain greedy before the first divergence (right)

Everything uses the rows pooled over all sets ("all"); temperature 0 is drawn solid with circles,
other temperatures dashed with squares. Needs matplotlib (`pip install 'minispec[bench]'`).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from minispec.cli import run_main  # noqa: E402

PROG = "bench_plot"


def plot(result: dict, path: Path) -> Path:
    """Write the figure described in the module docstring to `path`; return `path`."""
    rows = [r for r in result["summary"] if r["set"] == "all" and r["tool"] == "minispec" and r["drafter"] is not None]
    drafters = list(dict.fromkeys(r["drafter"] for r in rows))
    policies = list(dict.fromkeys(r["spec"] for r in rows))
    temperatures = list(dict.fromkeys(r["temperature"] for r in rows))
    gammas = sorted({r["gamma"] for r in rows})
    colours = {p: plt.cm.tab10(i % 10) for i, p in enumerate(policies)}
    styles = {t: ("-", "o") if t == 0 else ("--", "s") for t in temperatures}

    columns = max(2, len(drafters))
    fig, axes = plt.subplots(3, columns, figsize=(4.2 * columns, 11), squeeze=False)
    for col, drafter in enumerate(drafters):
        for row_index, (metric, title) in enumerate((("tau", "tau"), ("speedup", "speed-up vs plain"))):
            ax = axes[row_index][col]
            for policy in policies:
                for t in temperatures:
                    points = sorted((r["gamma"], r[metric]) for r in rows if r["drafter"] == drafter
                                    and r["spec"] == policy and r["temperature"] == t and r[metric] is not None)
                    if points:
                        line, marker = styles[t]
                        ax.plot(*zip(*points), line, marker=marker, color=colours[policy], label=f"{policy} T={t:g}")
            if metric == "speedup":
                ax.axhline(1.0, color="grey", linewidth=0.8)
            ax.set_title(f"{drafter}: {title}")
            ax.set_xlabel("gamma")
            ax.set_xticks(gammas)
            ax.grid(alpha=0.3)
    for col in range(len(drafters), columns):  # unused panels in rows 1-2
        axes[0][col].axis("off")
        axes[1][col].axis("off")

    quality = (("nll", "target NLL of the output"), ("agree_prefix", "agreement with greedy (prefix)"))
    for ax, (metric, label) in zip(axes[2], quality):
        for r in rows:
            if r[metric] is not None and r["tau"] is not None:
                _, marker = styles[r["temperature"]]
                ax.scatter(r["tau"], r[metric], color=colours[r["spec"]], marker=marker, s=28)
        ax.set_xlabel("tau")
        ax.set_ylabel(label)
        ax.set_title(f"{label.split(' (')[0]} vs tau (o: T=0, s: T>0)", fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes[2][2:]:
        ax.axis("off")

    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False)
    settings = result["settings"]
    fig.suptitle(f"minispec policies: {settings['dtype']}, {settings['kernels']} kernels, up to "
                 f"{settings['max_new_tokens']} new tokens, {settings['prompts_per_set']} prompt(s) x "
                 f"{len(settings['sets'])} sets, all sets pooled", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 0.97))
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    default = benchlib.out_dir("bench_policies", None) / "bench_policies.json"
    parser = benchlib.Parser(prog=PROG, description=__doc__.strip().splitlines()[0])
    parser.add_argument("result", type=Path, nargs="?", default=None,
                        help="bench_policies.json (if not given: out/bench_policies/bench_policies.json)")
    parser.add_argument("--png", type=Path, default=None, help="the figure (if not given: next to the JSON, .png)")
    args = parser.parse_args(argv)
    source = args.result or default

    def body() -> int:
        result = benchlib.read_result(source, "result", "bench_policies", ("summary", "settings"))
        print(f"{PROG}: wrote {plot(result, args.png or source.with_suffix('.png'))}", file=sys.stderr)
        return 0

    return run_main(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
