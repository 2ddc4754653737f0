"""Check the converted default checkpoint against transformers' own GGUF loader.

    python scripts/tooling/check_conversion.py [--dest weights/smollm2-135m-instruct]

1. Every tensor of our model.safetensors equals what transformers' load_gguf_checkpoint makes
   from the same GGUF file (bit for bit: this is what proves the q/k un-permute).
2. transformers, loading our folder (config.json, tokenizer, chat template), answers
   "What is the capital of France?" with "The capital of France is Paris." (greedy, fp32) and
   continues a plain story prompt with the checkpoint's known greedy continuation.
3. The trap: putting the q/k rows back in llama.cpp's order leaves the model fluent but must
   raise the NLL of a passage by more than 0.5 nats per token.

Needs transformers and gguf (pip install 'minispec[test]'); tests/test_weights.py has the fast
tensor-by-tensor version of check 1.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from minispec.cli import Parser  # noqa: E402
from minispec.checkpoints.fetch import default_checkpoint_dir, ensure_default_checkpoint, fetch_gguf  # noqa: E402

PASSAGE = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named "
    "after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889. "
    "Locally nicknamed the Iron Lady, it was constructed as the centrepiece of the 1889 World's Fair, and "
    "to crown the centennial anniversary of the French Revolution."
)


def check_tensors(ckpt: Path, gguf_path: Path) -> bool:
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)  # only for transformers' name map
    reference = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=skeleton)["tensors"]
    ours = load_file(ckpt / "model.safetensors")
    differ = sorted(name for name in reference if name not in ours or not torch.equal(ours[name], reference[name]))
    extra = sorted(set(ours) - set(reference))
    print(f"tensors: {len(ours)} ours, {len(reference)} from transformers' GGUF loader; "
          f"{len(differ)} differ{' e.g. ' + differ[0] if differ else ''}; {len(extra)} extra")
    return not differ and not extra


def greedy(model, tokenizer, ids: list[int], n: int) -> str:
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)


def passage_nll(model, ids: list[int]) -> float:
    with torch.no_grad():
        return model(torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()


def check_behaviour(ckpt: Path) -> bool:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                         add_generation_prompt=True, tokenize=True, return_dict=False)
    answer = greedy(model, tokenizer, list(chat), 12)
    story = greedy(model, tokenizer, tokenizer.encode("Once upon a time, in a small village by the sea,"), 10)
    print(f"chat answer: {answer!r}\nstory: {story!r}")
    ok = answer.startswith("The capital of France is Paris.") and story.startswith(" there was a wise old wizard")

    passage = tokenizer.encode(PASSAGE)
    nll = passage_nll(model, passage)
    with torch.no_grad():  # undo our un-permute: the rows as llama.cpp stores them
        for layer in model.model.layers:
            for proj, n_head in ((layer.self_attn.q_proj, model.config.num_attention_heads),
                                 (layer.self_attn.k_proj, model.config.num_key_value_heads)):
                w = proj.weight
                proj.weight.copy_(w.reshape(n_head, 2, w.shape[0] // n_head // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape))
    nll_permuted = passage_nll(model, passage)
    print(f"passage NLL: {nll:.2f} converted, {nll_permuted:.2f} with q/k left in llama.cpp's order")
    return ok and nll_permuted > nll + 0.5


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="check_conversion", description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=default_checkpoint_dir())
    args = parser.parse_args(argv)
    started = time.perf_counter()
    ckpt = ensure_default_checkpoint(args.dest)
    with tempfile.TemporaryDirectory(prefix="minispec-check-") as workdir:
        tensors_ok = check_tensors(ckpt, fetch_gguf(workdir))
    behaviour_ok = check_behaviour(ckpt)
    ok = tensors_ok and behaviour_ok
    print(f"{'OK' if ok else 'FAILED'} in {time.perf_counter() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
