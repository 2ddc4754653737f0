"""The figures of docs/dropmatch.md: tau gain against quality change, and head agreement against p.

    python scripts/dropmatch/dropmatch_plot.py [--quality out/dropmatch_quality*/dropmatch_quality.json ...]
                                     [--calibration out/dropmatch_calibration*/dropmatch_calibration.json ...]
                                     [--png out/dropmatch_plot/dropmatch_pareto.png]

Pareto figure (from one or more dropmatch_quality.json, e.g. runs split over processes): every
DropMatch configuration on all text prompts as a point, x = tau gain over its base, y = change in
the target's NLL (left) and in the addition task score (right), with 95% intervals as bars; the
Pareto front (most tau gain for a given quality change) drawn as a line. Agreement figure (from
one dropmatch_calibration.json per checkpoint): all-K head agreement against p, measured (points)
with the first-order and Gaussian estimates (lines), and the p a measured bisection picks for
agreement 0.8 (--dropout-p auto's default level) as a dashed line. Needs matplotlib.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt  # noqa: E402

from minispec.cli import run_main  # noqa: E402

PROG = "dropmatch_plot"


def load(paths: list[Path], flag: str, made_by: str, needs: tuple[str, ...]) -> list[dict]:
    return [benchlib.read_result(path, flag, made_by, needs) for path in paths]


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not dominated by another with more gain and no worse cost: (gain, cost), cost lower is better."""
    front = [pt for pt in points if not any(o[0] >= pt[0] and o[1] <= pt[1] and o != pt for o in points)]
    return sorted(front)


def plot_pareto(results: list[dict], path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    panels = (("all text", "nll_change", "change in the target's NLL (relative)"),
              ("addition", "correct_change", "change in addition score (points)"))
    for ax, (group, key, label) in zip(axes, panels):
        points = []
        for result in results:
            for r in result["rows"]:
                if r["group"] != group or r["policy"] == "base" or r.get(key) is None or r.get("tau_gain") is None:
                    continue
                scale = 100 if key == "correct_change" else 1  # the score in points
                y = scale * r[key]
                cost = y if key == "nll_change" else -y  # lower is better on both axes as drawn
                style = "o" if r["temperature"] == 0 else "s"
                ci = [scale * c for c in (r.get(f"{key}_ci") or [r[key], r[key]])]
                xci = r.get("tau_gain_ci") or [r["tau_gain"], r["tau_gain"]]
                ax.errorbar(r["tau_gain"], y, yerr=[[y - ci[0]], [ci[1] - y]],
                            xerr=[[r["tau_gain"] - xci[0]], [xci[1] - r["tau_gain"]]], fmt=style, capsize=2)
                ax.annotate(f"{r['policy']} g{r['gamma']} T{r['temperature']:g}", (r["tau_gain"], y), fontsize=6)
                points.append((r["tau_gain"], cost))
        front = pareto_front(points)
        if front:
            ax.plot([g for g, _ in front], [c if key == "nll_change" else -c for _, c in front], "k--", lw=0.8,
                    label="Pareto front")
            ax.legend(fontsize=7)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xlabel("tau gain over the base")
        ax.set_ylabel(label)
        ax.set_title(group, fontsize=9)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def plot_agreement(calibrations: list[dict], path: Path, level: float = 0.8) -> Path:
    """All-K head agreement against p for every model of every calibration (one per checkpoint:
    several checkpoints share the figure), with a vertical tick at the p that a measured bisection
    picks for `level` (what --dropout-p auto does, here on the calibration's own positions)."""
    paths = calibrations[0]["settings"]["paths"]
    fig, axes = plt.subplots(1, len(paths), figsize=(5.5 * len(paths), 4.5), squeeze=False)
    for ax, k in zip(axes[0], map(str, paths)):
        i = 0
        for calibration in calibrations:
            s = calibration["settings"]
            ckpt = (calibration.get("run", {}).get("checkpoint") or {}).get("name", "real")
            for name, m in calibration["models"].items():
                if k not in m:
                    continue
                label = ckpt if name == "real" else name
                c = m[k]
                ax.plot(s["ps"], c["measured"], "o", color=f"C{i}", ms=4, label=f"{label}: measured")
                ax.plot(s["ps"], c["first_order"], "-", color=f"C{i}", lw=1, label=f"{label}: first order")
                ax.plot(s["ps"], c["gaussian"], ":", color=f"C{i}", lw=1, label=f"{label}: Gaussian")
                pick = next((pk["p_measured"] for pk in c["picks"] if pk["level"] == level), None)
                if name == "real" and pick:
                    ax.axvline(pick, color=f"C{i}", lw=0.8, ls="--", label=f"{label}: p for agreement {level:g}")
                i += 1
        ax.set_xscale("log")
        ax.set_xlabel("dropout p")
        ax.set_ylabel(f"share of positions where all K = {k} heads keep the argmax")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def build_parser() -> benchlib.Parser:
    p = benchlib.Parser(prog=PROG, description=__doc__.strip().splitlines()[0])
    p.add_argument("--quality", type=Path, nargs="*", default=[], help="dropmatch_quality.json files")
    p.add_argument("--calibration", type=Path, nargs="*", default=[],
                   help="dropmatch_calibration.json files (one per checkpoint: drawn in one figure)")
    p.add_argument("--out", type=benchlib.out_folder("--out"), default=None, help="output folder (if not given: out/dropmatch_plot/)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = benchlib.out_dir(PROG, args.out)

    def body() -> int:
        if args.quality:
            quality = load(args.quality, "--quality", "dropmatch_quality", ("rows",))
            print(plot_pareto(quality, out / "dropmatch_pareto.png"))
        if args.calibration:
            calibration = load(args.calibration, "--calibration", "dropmatch_calibration", ("settings", "models"))
            print(plot_agreement(calibration, out / "dropmatch_agreement.png"))
        return 0

    return run_main(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
