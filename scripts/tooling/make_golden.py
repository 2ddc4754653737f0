"""Write tests/data/golden_smollm2.json: transformers' fp32 logits on a few fixed prompts.

The reference is transformers' own LlamaForCausalLM loading the converted folder (whose
tensors scripts/tooling/check_conversion.py shows bit-identical to transformers' own GGUF loading).
For each prompt we store the token ids, and at every position the top-5 token ids with their
logits plus the logits of a fixed set of probe ids, so the test can check both the ranking
and the values without committing a [T, 49152] array.

    python scripts/tooling/make_golden.py [--ckpt weights/smollm2-135m-instruct]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from minispec.cli import Parser  # noqa: E402

PROMPTS = [
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "The capital of France is Paris. The capital of Germany is",
]
PROBE_IDS = [0, 1, 2, 13, 260, 1000, 5000, 20000, 49151]
OUT = ROOT / "tests" / "data" / "golden_smollm2.json"


def main(argv: list[str] | None = None) -> int:
    import transformers
    from transformers import AutoModelForCausalLM

    from minispec import load_tokenizer
    from minispec.checkpoints.fetch import ensure_default_checkpoint

    parser = Parser(prog="make_golden", description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", type=Path, default=None, help="checkpoint folder (if not given: the default one)")
    ckpt = parser.parse_args(argv).ckpt or ensure_default_checkpoint()
    tok = load_tokenizer(ckpt)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    records = []
    for text in PROMPTS:
        ids = tok.encode(text)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]  # [T, V]
        top = torch.topk(logits, 5, dim=-1)
        records.append({
            "prompt": text,
            "ids": ids,
            "top5_ids": top.indices.tolist(),
            "top5_logits": top.values.tolist(),
            "probe_logits": logits[:, PROBE_IDS].tolist(),
        })
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"transformers_version": transformers.__version__, "torch_version": torch.__version__,
                               "probe_ids": PROBE_IDS, "prompts": records}))
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
