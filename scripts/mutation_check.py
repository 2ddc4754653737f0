"""Mutation check: does the property suite catch the bugs people actually hit?

    python scripts/mutation_check.py [--only NAME ...] [--skip-baseline] [--timeout SECONDS]

Copies the package and its tests to a temporary folder, checks that the unmutated suite passes
there, then applies one realistic bug at a time (the catalogue below) and runs the suite with
`pytest -x`. A mutant is killed when some test fails; the table names the first failing test
and the time it took. The last line reads `killed K of N mutants`; the exit status is non-zero
if any mutant survived (or the baseline failed).

The suite runs under the `mutation` hypothesis profile: the ci profile's examples and
derandomization, without shrinking (we only need to know *that* a test fails) and without the
example database (so one mutant's failures are not replayed against the next).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from minispec.cli import Parser, ranged

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to the repository root
    old: str  # must occur exactly once in the file
    new: str
    why: str  # where this bug comes from


CATALOGUE = [
    Mutant("truncate-off-by-one", "minispec/kv_cache.py",
           "        self.length = length\n",
           "        self.length = length + (length < self.length)  # keeps one stale entry\n",
           "rollback that keeps the first rejected draft's K/V visible"),
    Mutant("mask-ignores-cache-offset", "minispec/model.py",
           "query_pos = torch.arange(start, start + num_new, device=device)[:, None]",
           "query_pos = torch.arange(num_new, device=device)[:, None]",
           "a causal mask only right when a pass starts at position 0 (LLMs-from-scratch style)"),
    Mutant("gqa-repeat-wrong-indexing", "minispec/model.py",
           "            q, k, v, attn_mask=mask, enable_gqa=self.num_kv_heads != self.num_heads\n",
           "            q, k.repeat(1, self.num_heads // self.num_kv_heads, 1, 1),\n"
           "            v.repeat(1, self.num_heads // self.num_kv_heads, 1, 1), attn_mask=mask\n",
           "K/V expanded with repeat (tiling) instead of repeat_interleave: head h reads kv head h % n_kv"),
    Mutant("rope-positions-not-offset", "minispec/model.py",
           "positions = torch.arange(start, start + T, device=input_ids.device)",
           "positions = torch.arange(T, device=input_ids.device)",
           "RoPE applied at positions 0..T-1 in every cached pass"),
    Mutant("qk-unpermute-missing", "minispec/weights.py",
           "weight = unpermute_qk(weight, heads[projection])",
           "weight = weight",
           "GGUF conversion without undoing llama.cpp's q/k row permutation"),
    Mutant("qk-norm-after-rope", "minispec/model.py",
           "        if self.q_norm is not None:\n            q, k = self.q_norm(q), self.k_norm(k)\n"
           "        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H(kv), T, hd]\n"
           "        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)\n",
           "        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H(kv), T, hd]\n"
           "        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)\n"
           "        if self.q_norm is not None:\n            q, k = self.q_norm(q), self.k_norm(k)\n",
           "Qwen3's QK-norm applied after RoPE instead of before"),
    Mutant("residual-not-renormalised", "minispec/acceptance/sampling.py",
           "excess / torch.where(mass > 0, mass, torch.ones_like(mass))",
           "excess",
           "residual max(0, p - q) used without dividing by its mass"),
    Mutant("draft-greedy-while-target-samples", "minispec/drafters.py",
           "            token = next_token(logits, params, generator)\n",
           "            token = int(logits.argmax())\n",
           "the drafter picks argmax but reports its full softmax as q_draft"),
    Mutant("temperature-on-p-not-q", "minispec/drafters.py",
           "return Draft(tokens, logits_to_probs(draft_logits, params), draft_logits)",
           "return Draft(tokens, logits_to_probs(draft_logits, params if params.greedy else "
           "SamplingParams(1.0, params.top_k, params.top_p)), draft_logits)",
           "q_draft computed at temperature 1 while p_target uses the requested temperature"),
    Mutant("bonus-token-dropped", "minispec/speculative.py",
           "emitted = draft.tokens[:n] + [decision.next_token]",
           "emitted = draft.tokens[:n] + ([decision.next_token] if n < g or g == 0 else [])",
           "no bonus token after a fully accepted draft"),
    Mutant("draft-cache-not-caught-up", "minispec/drafters.py",
           "logits = self._logits(context[self.cache.length:])",
           "logits = self._logits(context[self.cache.length:] if self.cache.length == 0 else context[-1:])",
           "after full acceptance the drafter never feeds d_gamma, its cache has a hole"),
    Mutant("dropmatch-centroid-mean-of-probs", "minispec/acceptance/dropmatch.py",
           "centroid_logits = path_logits.mean(dim=0) if self.p > 0 else path_logits[0]",
           "centroid_logits = torch.softmax(path_logits / temperature, dim=-1).mean(dim=0).log() * temperature "
           "if self.p > 0 else path_logits[0]",
           "DropMatch centroid as the mean of probabilities instead of the mean of logits"),
    Mutant("majority-off-by-one", "minispec/acceptance/dropmatch.py",
           "return 2 * votes > num_paths",
           "return 2 * votes >= num_paths",
           "strict majority counted as >= K/2 (a tie passes)"),
    Mutant("argmax-tie-rule-flipped", "minispec/sampling.py",
           "    return torch.argmax(logits, dim=-1)\n",
           "    return logits.shape[-1] - 1 - torch.argmax(logits.flip(-1), dim=-1)\n",
           "greedy picks the highest id among tied maxima"),
    Mutant("target-rollback-keeps-rejected", "minispec/speculative.py",
           "cache.truncate(len(seq) + n)",
           "cache.truncate(len(seq) + min(n + 1, g))",
           "the target cache keeps the first rejected draft"),
]


def copy_project(dest: Path) -> None:
    for name in ("minispec", "tests", "scripts", ".ci"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    (dest / "weights").symlink_to(ROOT / "weights")  # the converted checkpoint, shared read-only


# Test files that load the real checkpoint or run many generations go last, so that a mutant
# the fast tiny-model properties catch is killed in seconds. Every file still runs.
SLOW_LAST = ("test_testing.py", "test_readme.py", "test_cli.py", "test_real_checkpoint.py",
             "test_transformers_equivalence.py")


def test_files(workdir: Path) -> list[str]:
    files = sorted(p.name for p in (workdir / "tests").glob("test_*.py"))
    order = [f for f in files if f not in SLOW_LAST] + [f for f in SLOW_LAST if f in files]
    return [f"tests/{f}" for f in order]


def run_suite(workdir: Path, timeout: float) -> tuple[bool, str, float]:
    """(passed, first failing test or '', seconds)."""
    env = {**os.environ, "MINISPEC_PROFILE": "mutation", "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *test_files(workdir)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"(timed out after {timeout:.0f}s)", time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    if proc.returncode == 0:
        return True, "", seconds
    failed = re.search(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.MULTILINE)
    return False, failed.group(1) if failed else f"(pytest exit {proc.returncode})", seconds


def check_import_location(workdir: Path) -> None:
    out = subprocess.run([sys.executable, "-c", "import minispec; print(minispec.__file__)"], cwd=workdir,
                         capture_output=True, text=True, check=True).stdout.strip()
    if not out.startswith(str(workdir)):
        sys.exit(f"mutation_check: error: the suite would import minispec from {out}, not from the mutated copy")


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="mutation_check", description="Apply realistic bugs one at a time and check the suite catches each.")
    ap.add_argument("--only", nargs="*", default=None, help="run only these mutants (by name)")
    ap.add_argument("--skip-baseline", action="store_true", help="don't first check that the unmutated suite passes")
    ap.add_argument("--timeout", type=ranged(float, "--timeout", lo=0, lo_open=True), default=600,
                    help="seconds per suite run; a hang counts as killed")
    ap.add_argument("--list", action="store_true", help="list the catalogue and exit")
    args = ap.parse_args(argv)
    mutants = [m for m in CATALOGUE if args.only is None or m.name in args.only]
    if args.list:
        for m in CATALOGUE:
            print(f"{m.name:36s} {m.file:36s} {m.why}")
        return 0
    if args.only and len(mutants) != len(args.only):
        unknown = sorted(set(args.only) - {m.name for m in CATALOGUE})
        sys.exit(f"mutation_check: error: --only: unknown mutant(s) {unknown}; see --list")

    with tempfile.TemporaryDirectory(prefix="minispec-mutants-") as tmp:
        workdir = Path(tmp)
        copy_project(workdir)
        check_import_location(workdir)
        if not args.skip_baseline:
            ok, failed, seconds = run_suite(workdir, args.timeout)
            print(f"baseline (no mutation): {'passes' if ok else 'FAILS at ' + failed} in {seconds:.0f}s", flush=True)
            if not ok:
                return 2
        print(f"{'mutant':36s} {'killed by':72s} {'time':>6s}", flush=True)
        killed = 0
        for m in mutants:
            path = workdir / m.file
            pristine = path.read_text()
            if pristine.count(m.old) != 1:
                sys.exit(f"mutation_check: error: mutant {m.name}: its target text occurs {pristine.count(m.old)} "
                         f"times in {m.file}; expected exactly once (update the catalogue)")
            path.write_text(pristine.replace(m.old, m.new))
            try:
                passed, failed, seconds = run_suite(workdir, args.timeout)
            finally:
                path.write_text(pristine)
            killed += not passed
            print(f"{m.name:36s} {('SURVIVED' if passed else failed)[:72]:72s} {seconds:5.0f}s", flush=True)
        print(f"killed {killed} of {len(mutants)} mutants")
        return 0 if killed == len(mutants) else 1


if __name__ == "__main__":
    sys.exit(main())
