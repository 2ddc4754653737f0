"""Where a weight format moves the checkpoint's weights: the error of each linear weight, per projection.

    python scripts/speed/weight_error.py [--ckpt qwen2.5-coder-1.5b-instruct]

The converted checkpoint holds the GGUF file's dequantized values exactly (float32), so this is
what requantizing its blocks (Q4_K, Q6_K, ... already lossy) into a format changes. Per linear
weight W [out, in] and format, the relative error ||W' - W||_F / ||W||_F of the weight W' the
format multiplies by:

    nf4            minispec.kernels.nf4: NF4 levels per 64 weights, bfloat16 maxima, the kernel's
                   bfloat16 levels (Nf4Linear.weight())
    int8 per row   the weights of int8-dynamic (and int8): s = max |W[j]| / 127, round(W / s) s
    bfloat16       the weights rounded to bfloat16, for scale

reported per projection (q, k, v, o, gate, up, down, the LM head) as the median and the largest
over layers. Writes weight_error.json and .md to --out (default out/weight_error/).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchlib, the harness every script shares
import benchlib
from benchlib import md_table, median

import torch  # noqa: E402

from minispec.kernels import nf4  # noqa: E402

PROG = "weight_error"
FORMATS = ("nf4", "int8 per row", "bfloat16")


def requantized(weight: torch.Tensor, name: str) -> torch.Tensor:
    if name == "nf4":
        return nf4.Nf4Linear(weight, None).weight()
    if name == "int8 per row":
        scale = weight.abs().amax(1, keepdim=True).clamp(min=1e-12) / 127  # [out, 1]
        return torch.round(weight / scale).clamp(-127, 127) * scale
    return weight.to(torch.bfloat16).float()


def measure_errors(args, ckpt: Path) -> dict:
    from safetensors import safe_open

    if not nf4.available():
        raise benchlib.MinispecError("nf4: needs bitsandbytes (pip install 'minispec[nf4]') and an AVX512-BF16 CPU")
    errors: dict[str, dict[str, list[float]]] = {}
    with safe_open(ckpt / "model.safetensors", framework="pt") as f:
        for key in f.keys():
            match = re.search(r"(q|k|v|o|gate|up|down)_proj\.weight$|^lm_head\.weight$", key)
            if match is None:
                continue
            weight = f.get_tensor(key).float()  # [out, in]
            group = match.group(1) or "head"
            for name in FORMATS:
                error = (requantized(weight, name) - weight).norm() / weight.norm()
                errors.setdefault(group, {}).setdefault(name, []).append(error.item())
    return {"errors": errors}


def render(result: dict) -> str:
    rows = [[group] + [f"{median(by[name]):.4f} / {max(by[name]):.4f}" for name in FORMATS]
            for group, by in result["errors"].items()]
    return "\n".join([f"# minispec: {PROG}\n", benchlib.record_markdown(result["run"]),
                      "||W' - W|| / ||W||, median / largest over layers.\n",
                      md_table(["projection"] + list(FORMATS), rows) + "\n"])


def main(argv: list[str] | None = None) -> int:
    parser = benchlib.script_parser(PROG, __doc__, threads=False)
    parser.set_defaults(ckpt=Path("qwen2.5-coder-1.5b-instruct"))
    return benchlib.run_benchmark(PROG, argv, parser, measure_errors, render)


if __name__ == "__main__":
    sys.exit(main())
