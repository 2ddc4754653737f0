"""Mutation check: does the property suite catch the bugs people actually hit?

    python scripts/tooling/mutation_check.py [--only NAME ...] [--skip-baseline] [--timeout SECONDS]

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

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to the repository root
    old: str  # must occur exactly once in the file
    new: str
    why: str  # where this bug comes from
    first: tuple[str, ...] = ()  # test files to run first (the suite still runs whole): kills come sooner


CATALOGUE = [
    Mutant("truncate-off-by-one", "minispec/model/kv_cache.py",
           "        self.length = length\n",
           "        self.length = length + (length < self.length)  # keeps one stale entry\n",
           "rollback that keeps the first rejected draft's K/V visible", ('tests/test_model.py',)),
    Mutant("mask-ignores-cache-offset", "minispec/model/kv_cache.py",
           "query_pos = torch.arange(start, start + num_new, device=device)[:, None]",
           "query_pos = torch.arange(num_new, device=device)[:, None]",
           "a causal mask only right when a pass starts at position 0 (a common tutorial shortcut)", ('tests/test_model.py',)),
    Mutant("gqa-repeat-wrong-indexing", "minispec/model/transformer.py",
           "            q, k, v, attn_mask=mask, enable_gqa=self.num_kv_heads != self.num_heads\n",
           "            q, k.repeat(1, self.num_heads // self.num_kv_heads, 1, 1),\n"
           "            v.repeat(1, self.num_heads // self.num_kv_heads, 1, 1), attn_mask=mask\n",
           "K/V expanded with repeat (tiling) instead of repeat_interleave: head h reads kv head h % n_kv", ('tests/test_model.py',)),
    Mutant("rope-positions-not-offset", "minispec/model/kv_cache.py",
           "return torch.arange(self.length, self.length + num_new, device=self.k[0].device)",
           "return torch.arange(num_new, device=self.k[0].device)",
           "RoPE applied at positions 0..T-1 in every cached pass", ('tests/test_model.py',)),
    Mutant("qk-unpermute-missing", "minispec/checkpoints/convert.py",
           "weight = unpermute_qk(weight, planned.unpermute_heads)",
           "weight = weight",
           "GGUF conversion without undoing llama.cpp's q/k row permutation", ('tests/test_weights.py',)),
    Mutant("qk-norm-after-rope", "minispec/model/transformer.py",
           "        if self.q_norm is not None:\n            q, k = self.q_norm(q), self.k_norm(k)\n"
           "        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H(kv), T, hd]\n"
           "        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)\n",
           "        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H(kv), T, hd]\n"
           "        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)\n"
           "        if self.q_norm is not None:\n            q, k = self.q_norm(q), self.k_norm(k)\n",
           "Qwen3's QK-norm applied after RoPE instead of before", ('tests/test_model.py',)),
    Mutant("residual-not-renormalised", "minispec/acceptance/sampling.py",
           "excess / torch.where(mass > 0, mass, torch.ones_like(mass))",
           "excess",
           "residual max(0, p - q) used without dividing by its mass", ('tests/test_policy_sampling.py',)),
    Mutant("draft-greedy-while-target-samples", "minispec/chain/drafters.py",
           "            token = next_token(logits, params, generator)\n",
           "            token = int(logits.argmax())\n",
           "the drafter picks argmax but reports its full softmax as q_draft", ('tests/test_speculative.py',)),
    Mutant("temperature-on-p-not-q", "minispec/chain/drafters.py",
           "return Draft(tokens, logits_to_probs(draft_logits, params), draft_logits)",
           "return Draft(tokens, logits_to_probs(draft_logits, params if params.greedy else "
           "SamplingParams(1.0, params.top_k, params.top_p)), draft_logits)",
           "q_draft computed at temperature 1 while p_target uses the requested temperature", ('tests/test_speculative.py',)),
    Mutant("bonus-token-dropped", "minispec/chain/speculative.py",
           "emitted = draft.tokens[:n] + [decision.next_token]",
           "emitted = draft.tokens[:n] + ([decision.next_token] if n < g or g == 0 else [])",
           "no bonus token after a fully accepted draft", ('tests/test_speculative.py',)),
    Mutant("draft-cache-not-caught-up", "minispec/chain/drafters.py",
           "logits = self._logits(context[self.cache.length:])",
           "logits = self._logits(context[self.cache.length:] if self.cache.length == 0 else context[-1:])",
           "after full acceptance the drafter never feeds d_gamma, its cache has a hole", ('tests/test_speculative.py',)),
    Mutant("dropmatch-centroid-mean-of-probs", "minispec/acceptance/dropmatch/rule.py",
           "centroid_logits = path_logits.mean(dim=0) if self.p > 0 else path_logits[0]",
           "centroid_logits = torch.softmax(path_logits / temperature, dim=-1).mean(dim=0).log() * temperature "
           "if self.p > 0 else path_logits[0]",
           "DropMatch centroid as the mean of probabilities instead of the mean of logits", ('tests/test_policy_dropmatch.py',)),
    Mutant("majority-off-by-one", "minispec/acceptance/dropmatch/rule.py",
           "return 2 * votes > num_paths",
           "return 2 * votes >= num_paths",
           "strict majority counted as >= K/2 (a tie passes)", ('tests/test_policy_dropmatch.py',)),
    Mutant("argmax-tie-rule-flipped", "minispec/model/sampling.py",
           "    return torch.argmax(logits, dim=-1)\n",
           "    return logits.shape[-1] - 1 - torch.argmax(logits.flip(-1), dim=-1)\n",
           "greedy picks the highest id among tied maxima", ('tests/test_policy_exact.py',)),
    Mutant("target-rollback-keeps-rejected", "minispec/chain/speculative.py",
           "cache.truncate(len(seq) + n)",
           "cache.truncate(len(seq) + min(n + 1, g))",
           "the target cache keeps the first rejected draft", ('tests/test_speculative.py',)),
    # The loop: where a run ends inside an accepted run, and what it counts.
    Mutant("eos-checked-after-the-step", "minispec/chain/loop.py",
           "        reason = finish_reason(tokens, eos, max_new_tokens, stop_when)\n        if reason is not None:\n"
           "            break\n    return tokens[num_before:], reason\n",
           "        reason = finish_reason(tokens, eos, max_new_tokens, stop_when)\n"
           "    return tokens[num_before:], reason\n",
           "an eos inside an accepted run is seen only after the whole step is committed", ("tests/test_speculative.py",)),
    Mutant("draft-past-max-new-tokens", "minispec/chain/speculative.py",
           "g = min(draft_length.next(), max_new_tokens - len(tokens) - 1)", "g = draft_length.next()",
           "the drafter is asked for gamma tokens though fewer can still be emitted", ("tests/test_speculative.py",)),
    Mutant("stats-count-drafts-after-eos", "minispec/chain/loop.py",
           "    if num_committed <= num_accepted:\n", "    if False:\n",
           "tau and acceptance count accepted drafts that were cut off after an eos", ("tests/test_speculative.py",)),
    Mutant("prompt-check-adds-gamma", "minispec/chain/speculative.py",
           "    prompt, params, generator, eos = check_request(target, prompt_ids, max_new_tokens, temperature,",
           "    prompt, params, generator, eos = check_request(target, prompt_ids, max_new_tokens + (gamma + 1 if draft "
           "is not None else 0), temperature,",
           "a prompt that fits exactly is refused with a draft (room for gamma + 1 the caches never use)",
           ("tests/test_speculative.py",)),
    Mutant("policy-not-seeded-by-run", "minispec/chain/speculative.py",
           "    policy.reset(seed)", "    policy.reset()",
           "generate(seed=...) never reaches DropMatch's mask generator", ("tests/test_speculative.py",)),
    Mutant("ngram-drafter-keeps-first-vocabulary", "minispec/chain/drafters.py",
           "            if spec.vocab_size is None:  # the target's vocabulary, for this run only: the object stays reusable\n"
           "                spec = copy.copy(spec)\n",
           "            if spec.vocab_size is None:  # the target's vocabulary, for this run only: the object stays reusable\n",
           "an NgramDrafter object takes the first target's vocabulary size and keeps it", ("tests/test_speculative.py",)),
    # DropMatch: the boundaries of its rules, its masks, and the temperature of the JS test.
    Mutant("lazy-majority-off-by-one", "minispec/acceptance/dropmatch/lazy.py",
           "if 2 * votes > self.paths:", "if 2 * votes >= self.paths:",
           "the lazy class's strict majority passes a tie at K/2", ("tests/test_dropmatch_definition.py",)),
    Mutant("plurality-tie-wins", "minispec/acceptance/dropmatch/rule.py",
           "    return votes > rival_votes", "    return votes >= rival_votes",
           "a plurality vote tied with another token counts as a win", ("tests/test_dropmatch_definition.py",)),
    Mutant("masks-shared-across-positions", "minispec/acceptance/dropmatch/rule.py",
           "uniform = torch.rand((self.paths, *hidden.shape), generator=self._generator)",
           "uniform = torch.rand((self.paths, 1, hidden.shape[-1]), generator=self._generator).expand(-1, hidden.shape[0], -1)",
           "one mask per path reused at every position of the step", ("tests/test_dropmatch_definition.py",)),
    Mutant("lazy-mask-of-position-0", "minispec/acceptance/dropmatch/lazy.py",
           "self.hidden[i] * self.masks[:, i] / (1.0 - self.p)", "self.hidden[i] * self.masks[:, 0] / (1.0 - self.p)",
           "the lazy class scores every position with position 0's masks", ("tests/test_dropmatch_definition.py",)),
    Mutant("js-draft-side-at-temperature-1", "minispec/acceptance/dropmatch/rule.py",
           "draft_probs = torch.softmax(inp.draft_logits.to(path_logits.dtype) / temperature, dim=-1)",
           "draft_probs = torch.softmax(inp.draft_logits.to(path_logits.dtype), dim=-1)",
           "the JS test reads the draft at T = 1 and the heads at the sampling temperature",
           ("tests/test_dropmatch_definition.py",)),
    Mutant("js-centroid-at-temperature-1", "minispec/acceptance/dropmatch/rule.py",
           "centroid_probs = torch.softmax(centroid_logits / temperature, dim=-1)  # [gamma, V]: pbar",
           "centroid_probs = torch.softmax(centroid_logits, dim=-1)  # [gamma, V]: pbar",
           "the centroid pbar without the temperature", ("tests/test_dropmatch_definition.py",)),
    Mutant("js-heads-at-temperature-1", "minispec/acceptance/dropmatch/rule.py",
           "head_probs = torch.softmax(path_logits / temperature, dim=-1)  # [K, gamma, V]: p_k",
           "head_probs = torch.softmax(path_logits, dim=-1)  # [K, gamma, V]: p_k",
           "the heads p_k (the radius) without the temperature", ("tests/test_dropmatch_definition.py",)),
    Mutant("js-temperature-ignores-sampling-T", "minispec/acceptance/dropmatch/rule.py",
           "        temperature = self.js_temperature if inp.params.greedy else inp.params.temperature\n"
           "        centroid_logits = path_logits.mean(dim=0) if self.p > 0 else path_logits[0]  # [gamma, V]: mean_k l_k",
           "        temperature = self.js_temperature\n"
           "        centroid_logits = path_logits.mean(dim=0) if self.p > 0 else path_logits[0]  # [gamma, V]: mean_k l_k",
           "the JS test at js_temperature also when sampling at another T", ("tests/test_dropmatch_definition.py",)),
    Mutant("js-strict-inequality", "minispec/acceptance/dropmatch/rule.py",
           "return js_divergence(draft_probs, centroid_probs) <= radius",
           "return js_divergence(draft_probs, centroid_probs) < radius",
           "the radius test made strict: a draft exactly at the radius is rejected", ("tests/test_dropmatch_definition.py",)),
    Mutant("lazy-js-closed-form", "minispec/acceptance/dropmatch/lazy.py",
           "    js_draft = float(js_divergence(draft_probs, centroid_probs))\n",
           "    d = int(draft_probs.argmax())\n    a = centroid_probs[d]\n"
           "    js_draft = (float((LN2 + 0.5 * (torch.xlogy(a, a) - torch.xlogy(1 + a, 1 + a))).clamp(min=0))\n"
           "                if float(draft_probs[d]) == 1 else float(js_divergence(draft_probs, centroid_probs)))\n",
           "JS to a one-hot draft in closed form: rounds differently from the sum at exact ties",
           ("tests/test_policy_dropmatch.py",)),
    Mutant("dropmatch-only-rejection-uses-residual", "minispec/acceptance/dropmatch/rule.py",
           "if num_accepted < inp.gamma and bool(base_accepted[num_accepted]):", "if False:",
           "or_base=False: a rejection only DropMatch made corrects from norm(max(0, p - q))",
           ("tests/test_dropmatch_definition.py",)),
    # The converter: faults and a user's folders.
    Mutant("convert-no-recheck-under-lock", "minispec/checkpoints/fetch.py",
           "        if is_complete(dest) and not force:  # converted by another process while we waited, or restored",
           "        if False:  # converted by another process while we waited, or restored",
           "two racing first-use conversions both convert (the loser finds the folder taken)",
           ("tests/test_weights_faults.py",)),
    Mutant("convert-no-lock", "minispec/checkpoints/fetch.py",
           "    if fcntl is None:\n        yield\n        return", "    if True:\n        yield\n        return",
           "no lock: racing conversions interleave", ("tests/test_weights_faults.py",)),
    Mutant("convert-stale-work-folders-kept", "minispec/checkpoints/fetch.py",
           "        for work in _work_folders(dest):\n            shutil.rmtree(work, ignore_errors=True)",
           "        for work in _work_folders(dest):\n            pass",
           "a killed conversion's temp folder (hundreds of MB) is never removed", ("tests/test_weights_faults.py",)),
    Mutant("convert-cleanup-misses-ctrl-c", "minispec/checkpoints/fetch.py",
           "        finally:\n            shutil.rmtree(work, ignore_errors=True)\n    size_mib",
           "        except Exception:\n            shutil.rmtree(work, ignore_errors=True)\n            raise\n    size_mib",
           "the temp folder is cleaned on errors but not on Ctrl-C or sys.exit", ("tests/test_weights_faults.py",)),
    Mutant("force-deletes-other-files", "minispec/checkpoints/fetch.py",
           "        if entry.name not in CONVERTED_FILES:\n            os.replace(entry, dest / entry.name)",
           "        if False:\n            os.replace(entry, dest / entry.name)",
           "--force removes files in the destination that the converter never wrote", ("tests/test_weights.py",)),
    Mutant("force-swap-not-restored", "minispec/checkpoints/fetch.py",
           "        else:\n            os.replace(old, dest)", "        else:\n            pass",
           "a kill between --force's two renames leaves the checkpoint only under .old-*",
           ("tests/test_weights_faults.py",)),
    Mutant("qwen2-digits-grouped", "minispec/checkpoints/convert.py",
           r"""[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?""", r"""[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?""",
           "Qwen2's split given Llama 3's digit rule (runs of up to three digits), a copy-paste between recipes",
           ("tests/test_convert_qwen2.py",)),
    Mutant("qwen2-user-defined-tokens-split", "minispec/checkpoints/convert.py",
           "    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in user_defined])\n",
           "",
           "<tool_call> (a user-defined token, not a control one) cut into byte pieces", ("tests/test_convert_qwen2.py",)),
    Mutant("qwen2-nfc-normalized", "minispec/checkpoints/convert.py",
           "    tokenizer.pre_tokenizer = PRE_TOKENIZERS[kind[1]]()\n",
           "    tokenizer.pre_tokenizer = PRE_TOKENIZERS[kind[1]]()\n    from tokenizers import normalizers\n"
           "    tokenizer.normalizer = normalizers.NFC()\n",
           "the published tokenizer.json's NFC normalizer, which llama.cpp and the GGUF's own ids do not apply",
           ("tests/test_convert_qwen2.py",)),
    Mutant("bf16-output-truncated", "minispec/checkpoints/convert.py",
           "                weight = weight.to(torch.bfloat16).view(torch.int16)",
           "                weight = (weight.view(torch.int32) >> 16).to(torch.int16)",
           "bfloat16 output by dropping the low 16 bits (truncation) instead of rounding to nearest even",
           ("tests/test_convert_qwen2.py",)),
    Mutant("chunk-hash-unchecked", "minispec/checkpoints/fetch.py",
           "    if digest.hexdigest() != chunk.sha256:", "    if False:",
           "a chunk of a split GGUF joined without checking its pinned sha256", ("tests/test_weights.py",)),
    Mutant("gguf-errors-escape", "minispec/checkpoints/convert.py",
           "    except Exception as error:  # bad magic, truncated or garbled: gguf has no error type of its own",
           "    except (ValueError, OSError) as error:  # bad magic, truncated or garbled: gguf has no error type of its own",
           "a truncated GGUF file ends in an IndexError traceback", ("tests/test_weights.py",)),
    Mutant("empty-flag-is-the-current-folder", "minispec/cli.py",
           "        if not text.strip():", "        if False:",
           "--ckpt '', --prompt-file '' or --dest '' read as the current folder: a vague error, or a conversion into it",
           ("tests/test_bad_inputs.py",)),
    Mutant("empty-checkpoint-path-is-the-current-folder", "minispec/checkpoints/hub.py",
           "or not str(spec).strip():", ":",
           "load_model('') reads the current folder and fails on a config.json it never names",
           ("tests/test_bad_inputs.py",)),
    Mutant("batch-cache-sized-by-gamma", "minispec/batch/speculative.py",
           "max_new_tokens + min(gamma, max_new_tokens)", "max_new_tokens + gamma",
           "generate_batch(gamma=10**12) allocates (or refuses) a cache of 10**12 positions",
           ("tests/test_batch.py",)),
    Mutant("check-policy-base-ignored", "minispec/testing/checks.py",
           '        if base != "exact" or tuple(neutral_temperatures) != (0.0,):', "        if False:",
           "check_policy(..., base=...) without neutral= is silently ignored", ("tests/test_testing.py",)),
    Mutant("check-policy-neutral-blames-the-policy", "minispec/testing/checks.py",
           "    except (MinispecError, TypeError) as error:", "    except MinispecError as error:",
           "a neutral= option the policy does not take ends in a TypeError, not a usage line",
           ("tests/test_testing.py",)),
    Mutant("self-bf16-of-a-bf16-target", "minispec/chain/drafters.py",
           "        if target.dtype == torch.bfloat16:", "        if target.dtype == torch.float16:",
           "--draft self:bf16 of a bfloat16 target runs the target twice for nothing", ("tests/test_drafters.py",)),
    Mutant("disk-room-unchecked", "minispec/checkpoints/disk.py",
           "    if free < needed + HEADROOM:", "    if free < 0:",
           "too little room found only when the disk fills, minutes into a conversion", ("tests/test_weights.py",)),
    Mutant("disk-full-leaves-files", "minispec/checkpoints/convert.py",
           "        for path in written:\n            path.unlink(missing_ok=True)",
           "        for path in written[:-1]:\n            path.unlink(missing_ok=True)",
           "a full disk leaves the half-written file in the user's folder", ("tests/test_weights.py",)),
    Mutant("disk-full-raw-oserror", "minispec/checkpoints/convert.py",
           "        if isinstance(error, OSError):  # a full disk", "        if isinstance(error, KeyError):  # a full disk",
           "a full disk while converting is an OSError traceback", ("tests/test_weights.py",)),
    Mutant("disk-full-tokenizer-exception", "minispec/checkpoints/convert.py",
           '        if "os error" not in str(error):', "        if True:",
           "a full disk while writing tokenizer.json is a bare Exception traceback", ("tests/test_weights.py",)),
    Mutant("unwritable-destination-found-late", "minispec/checkpoints/fetch.py",
           "        work.mkdir()\n    except OSError as error:", "        work.mkdir()\n    except ValueError as error:",
           "a read-only destination is found only after the download", ("tests/test_weights_faults.py",)),
    # Draft trees: the mask, the positions, the compaction.
    Mutant("tree-mask-siblings-see-each-other", "minispec/trees/tree.py",
           "        mask[i + 1, [start + 1 + a for a in tree.path(i)]] = True",
           "        mask[i + 1, start + 1: start + 2 + i] = True",
           "a causal mask over the flattened tree: a node sees its earlier siblings and cousins",
           ("tests/test_tree.py",)),
    Mutant("tree-positions-by-index", "minispec/trees/tree.py",
           "    return torch.tensor([start] + [start + d for d in tree.depths], device=device)",
           "    return torch.arange(start, start + tree.num_nodes + 1, device=device)",
           "RoPE positions by node index instead of depth", ("tests/test_tree.py",)),
    Mutant("tree-compaction-keeps-rejected-sibling", "minispec/trees/tree.py",
           "    source = torch.tensor([start + 1 + node for node in path], dtype=torch.long)",
           "    source = torch.tensor([start + 1 + i for i in range(len(path))], dtype=torch.long)",
           "after a tree pass the cache keeps the first rows, not the accepted path's", ("tests/test_tree.py",)),
    Mutant("draft-tree-positions-by-index", "minispec/trees/drafters.py",
           "        positions = tree_positions(tree, base - 1, self.model.device)[1 + first_new:]",
           "        positions = torch.arange(base + first_new, base + tree.num_nodes, device=self.model.device)",
           "the draft model expands its tree with positions by row instead of depth", ("tests/test_tree.py",)),
    Mutant("draft-tree-mask-causal", "minispec/trees/drafters.py",
           "        mask = tree_mask(tree, base - 1, self.model.device)[1 + first_new:, : base + tree.num_nodes]",
           "        mask = torch.ones(tree.num_nodes - first_new, base + tree.num_nodes, dtype=torch.bool).tril(base + first_new)",
           "the draft model expands its tree with a causal mask: nodes see their cousins", ("tests/test_tree.py",)),
    Mutant('tree-residual-not-running', "minispec/trees/walks.py",
           'residual = residual_distribution(residual, q_child)',
           'residual = residual_distribution(p_target[node + 1], q_child)',
           'each sibling tested against p instead of the residual left by the siblings before it', ("tests/test_tree_acceptance.py",)),
    Mutant('tree-bonus-from-wrong-row', "minispec/trees/walks.py",
           'return path, choice[path[-1] + 1 if path else 0]',
           'return path, choice[path[-1] if path else 0]',
           "the token after the path read from the parent's row instead of the last node's", ("tests/test_tree_acceptance.py",)),
    Mutant('tree-typical-own-row', "minispec/trees/walks.py",
           'parent_rows = torch.tensor([parent + 1 for parent in tree.parents]',
           'parent_rows = torch.tensor([node + 1 for node in range(tree.num_nodes)]',
           "each node judged by its own row (which scores its children) instead of its parent's", ("tests/test_tree_acceptance.py",)),
    Mutant('tree-children-top-k-while-sampling', "minispec/trees/drafters.py",
           '        if params.greedy:\n            q_row = torch.softmax(masked, dim=-1)  # [V]',
           '        if True:\n            q_row = torch.softmax(masked, dim=-1)  # [V]',
           "at T > 0 the tree drafter proposes its top-k and reports its softmax as the siblings' q", ("tests/test_tree.py",)),
    Mutant('tree-siblings-with-replacement-q', "minispec/trees/drafters.py",
           '            remaining[token] = 0.0\n',
           '',
           'siblings drawn with replacement (or q not conditioned on the earlier siblings)', ("tests/test_tree.py",)),
    Mutant('tree-siblings-cut-by-their-own-value', "minispec/trees/drafters.py",
           "            if params.greedy:  # top-k children: keep the most probable paths (EAGLE-2's re-ranking)\n                candidates.sort(key=lambda c: -c[0])",
           "            if True:  # top-k children: keep the most probable paths (EAGLE-2's re-ranking)\n                candidates.sort(key=lambda c: -c[0])",
           'sampled siblings re-ranked and cut by their own drawn values: the kept ones are no longer draws from q', ("tests/test_tree.py",)),
    Mutant('tree-dropmatch-own-row', "minispec/trees/walks.py",
           'path_logits[:, rows], head_tokens[:, rows]',
           'path_logits[:, 1:], head_tokens[:, 1:]',
           "DropMatch judges each node with the dropout heads of its own row (its children's) instead of its parent's",
           ("tests/test_tree_dropmatch.py",)),
    Mutant('tree-dropmatch-js-reads-q-draft', "minispec/trees/walks.py",
           'draft_logits=None if tree.logits is None else tree.logits.to(device, target_logits.dtype))',
           'draft_logits=None)',
           "the JS test on a tree reads q_draft (a softmax at T = 1, top-k applied) instead of the node's own draft logits",
           ("tests/test_tree_dropmatch.py",)),
    Mutant('tree-dropmatch-residual-after-dropmatch-only-rejection', "minispec/trees/walks.py",
           '    elif base_child is not None:  # only DropMatch rejected',
           '    elif False:  # only DropMatch rejected',
           "where only DropMatch rejected (or_base off), the correction is drawn from a residual the base never made",
           ("tests/test_tree_dropmatch.py",)),
    Mutant('tree-dropmatch-base-ignored', "minispec/trees/walks.py",
           'if dm[c] or (policy.or_base and c == base_child)',
           'if dm[c]',
           "or_base ignored on trees: DropMatch alone decides", ("tests/test_tree_dropmatch.py",)),
    Mutant('fast-attention-square-mask-is-causal', "minispec/kernels/packed.py",
           '        if is_plain_causal(mask):',
           '        if mask is not None and mask.shape[0] == mask.shape[1]:',
           "the fast kernels take any square mask for a causal one (a tree fed at cache length 0)",
           ("tests/test_kernels_packed.py",)),
    # Batches: rows with their own lengths, rollbacks and randomness.
    Mutant('batch-one-rollback-for-all-rows', "minispec/batch/speculative.py",
           "        cache.truncate([len(seq) + d.num_accepted for seq, d in zip(seqs, decisions)])",
           "        cache.truncate([min(len(seq) + d.num_accepted for seq, d in zip(seqs, decisions))] * len(seqs))",
           "one row's rollback (the shortest) applied to every row of the batch", ("tests/test_batch.py",)),
    Mutant('ragged-mask-sees-other-rows-padding', "minispec/batch/ragged_cache.py",
           "        return (key_pos[None, None, :] <= self.positions(num_new)[:, :, None])[:, None]  # [B, 1, T, S]",
           "        return (key_pos[None, None, :] < span).expand(self.batch_size, num_new, span)[:, None]",
           "a padding mask for the longest row only: a shorter row attends to its pads and stale drafts",
           ("tests/test_batch.py",)),
    Mutant('ragged-mask-causal-from-longest-row', "minispec/batch/ragged_cache.py",
           "        return (key_pos[None, None, :] <= self.positions(num_new)[:, :, None])[:, None]  # [B, 1, T, S]",
           "        return (key_pos[None, None, :] <= span - num_new + torch.arange(num_new)[None, :, None])[:, None]"
           ".expand(self.batch_size, 1, num_new, span)",
           "one causal mask for the batch, offset by the longest row: shorter rows see past their own end",
           ("tests/test_batch.py",)),
    Mutant('ragged-rope-positions-by-column', "minispec/model/transformer.py",
           "            positions, mask = cache.positions(T), cache.mask(T)\n",
           "            positions, mask = cache.positions(T), cache.mask(T)\n"
           "            if positions.dim() == 2:  # a ragged batch: every row at the longest row's positions\n"
           "                positions = positions * 0 + positions[:, :1].max() + torch.arange(T)\n",
           "left-padding thinking: every row's new tokens rotated at the longest row's positions",
           ("tests/test_batch.py",)),
    Mutant('batch-shared-generator', "minispec/batch/speculative.py",
           "        rows = [_Row(i, prompts[i], torch.Generator(device=\"cpu\").manual_seed(seeds[i]))\n"
           "                for i in range(first, min(first + batch_size, len(prompts)))]",
           "        shared = torch.Generator(device=\"cpu\").manual_seed(seeds[first])\n"
           "        rows = [_Row(i, prompts[i], shared) for i in range(first, min(first + batch_size, len(prompts)))]",
           "one generator for the whole batch: a row's draws depend on how many its batch-mates made",
           ("tests/test_batch.py",)),
    Mutant('batch-policy-copies-share-state', "minispec/batch/speculative.py",
           "                row.policy = copy.deepcopy(policy)  # own state, own mask generator",
           "                row.policy = copy.copy(policy)  # own state, own mask generator",
           "shallow policy copies: every row's DropMatch draws masks from one generator", ("tests/test_batch.py",)),
    Mutant('batch-draft-cache-keeps-pads', "minispec/batch/drafters.py",
           "            self.cache.truncate([len(c) + max(0, min(len(t), g - 1)) for c, t, g in zip(contexts, tokens, gammas)])",
           "            pass",
           "the batched draft model keeps the pads fed to rows that stopped drafting early", ("tests/test_batch.py",)),
    Mutant('batch-finished-rows-stay-in-draft-cache', "minispec/batch/drafters.py",
           "        if not self.shares_target_cache:  # the loop compacts the target's cache itself\n            self.cache.keep_rows(rows)",
           "        pass",
           "rows leave the target's cache but not the draft model's: the rows no longer line up",
           ("tests/test_batch.py",)),
    # User mistakes: each a one-line error (tests/test_bad_inputs.py's table), not a traceback or a silent wrong run.
    Mutant('corrupt-safetensors-raw-error', 'minispec/checkpoints/load.py',
           '        with _open(file) as f:\n            for hf_name in f.keys():',
           '        with safe_open(file, framework="pt") as f:\n            for hf_name in f.keys():',
           'a truncated model.safetensors ends in a SafetensorError traceback', ('tests/test_bad_inputs.py',)),
    Mutant('integer-tensor-cast-silently', 'minispec/checkpoints/load.py',
           '                if not tensor.dtype.is_floating_point:',
           '                if False:',
           'an int32 tensor is cast to float and the model prints garbage', ('tests/test_bad_inputs.py',)),
    Mutant('config-not-an-object', 'minispec/model/config.py',
           '        if not isinstance(raw, dict):\n',
           '        if False:\n',
           'config.json that is a list or null ends in a traceback', ('tests/test_bad_inputs.py',)),
    Mutant('config-zero-heads-divides', 'minispec/model/config.py',
           '        if num_heads < 1:  # before dividing by it',
           '        if False:  # before dividing by it',
           'num_attention_heads: 0 without head_dim divides by zero', ('tests/test_bad_inputs.py',)),
    Mutant('config-rope-scaling-string', 'minispec/model/config.py',
           '        if scaling is not None and not isinstance(scaling, dict):',
           '        if False:',
           'rope_scaling given as a string ends in a traceback', ('tests/test_bad_inputs.py',)),
    Mutant('config-bool-from-string', 'minispec/model/config.py',
           'tie_word_embeddings=get("tie_word_embeddings", bool, False)',
           'tie_word_embeddings=bool(raw.get("tie_word_embeddings", False))',
           '"false" (a string) read as True', ('tests/test_bad_inputs.py',)),
    Mutant('config-eos-unchecked', 'minispec/model/config.py',
           '            (all(_token_id(t, self.vocab_size) for t in self.eos_token_ids), "eos_token_id"',
           '            (True, "eos_token_id"',
           "config.json's eos ids not checked against the vocabulary", ('tests/test_config.py',)),
    Mutant('generation-eos-string-iterated', 'minispec/checkpoints/tokenizer.py',
           '    if not all(is_int(i) and 0 <= i < vocab_size for i in ids):',
           '    if False:',
           '"eos_token_id": "two" becomes the eos ids [\'t\', \'w\', \'o\']', ('tests/test_bad_inputs.py',)),
    Mutant('chat-template-syntax-error-escapes', 'minispec/checkpoints/tokenizer.py',
           '        except jinja2.TemplateSyntaxError as err:\n',
           '        except jinja2.TemplateSyntaxError:\n            raise\n        except ZeroDivisionError as err:\n',
           'a chat template that does not parse ends in a jinja2 traceback', ('tests/test_bad_inputs.py',)),
    Mutant('chat-template-undefined-escapes', 'minispec/checkpoints/tokenizer.py',
           '        except jinja2.UndefinedError as err:\n',
           '        except jinja2.UndefinedError:\n            raise\n        except ZeroDivisionError as err:\n',
           'a chat template using an undefined name ends in a jinja2 traceback', ('tests/test_bad_inputs.py',)),
    Mutant('encode-surrogate-raw-error', 'minispec/checkpoints/tokenizer.py',
           '        check_text(text, "text")\n',
           '',
           "encoding a lone surrogate raises the tokenizers library's own exception", ('tests/test_bad_inputs.py',)),
    Mutant('stdin-read-with-locale', "minispec/generate/run.py",
           '        return _read_stdin()',
           '        return sys.stdin.read()',
           '--prompt-file - decodes stdin with the locale and its error handler', ('tests/test_bad_inputs.py',)),
    Mutant('seed-unbounded', "minispec/generate/flags.py",
           'type=ranged(int, "--seed", lo=0, hi=2**64, hi_open=True)',
           'type=int',
           '--seed beyond 64 bits reaches torch', ('tests/test_bad_inputs.py',)),
    Mutant('temperature-tiny-or-inf', 'minispec/model/sampling.py',
           '        if not _is_real(t) or not (t == 0 or MIN_TEMPERATURE <= t < math.inf):',
           '        if not t >= 0:',
           'temperature 1e-40 gives nan probabilities, inf samples uniformly', ('tests/test_bad_inputs.py',)),
    Mutant('top-p-nan-accepted', 'minispec/model/sampling.py',
           '        if self.top_p is not None and not (_is_real(self.top_p) and 0 < self.top_p <= 1):  # nan fails too',
           '        if self.top_p is not None and (self.top_p <= 0 or self.top_p > 1):',
           'top_p = nan passes the range check', ('tests/test_bad_inputs.py',)),
    Mutant('empty-system-dropped', "minispec/generate/run.py",
           '    system = [] if args.system is None else [{"role": "system", "content": args.system}]',
           '    system = [{"role": "system", "content": args.system}] if args.system else []',
           "--system '' silently ignored", ('tests/test_bad_inputs.py',)),
    Mutant('broken-pipe-traceback', 'minispec/cli.py',
           '    except BrokenPipeError:\n',
           '    except ZeroDivisionError:\n',
           'output piped into head ends in a BrokenPipeError traceback', ('tests/test_bad_inputs.py',)),
    Mutant('ctrl-c-traceback', 'minispec/cli.py',
           '    except KeyboardInterrupt:\n',
           '    except ZeroDivisionError:\n',
           'Ctrl-C prints a KeyboardInterrupt traceback', ('tests/test_bad_inputs.py',)),
    Mutant('ctrl-c-json-lost', "minispec/generate/run.py",
           '        if as_json:\n            print(json.dumps({"text": self.text()',
           '        if False:\n            print(json.dumps({"text": self.text()',
           'Ctrl-C with --json prints nothing', ('tests/test_bad_inputs.py',)),
    Mutant("prompt-read-not-interruptible", "minispec/cli.py",
           '    if os.name != "posix":\n        return file.read()\n    import select',
           '    if True:\n        return file.read()\n    import select',
           "a prompt file or stdin read in one blocking read(): a Ctrl-C that lands on a worker thread is lost "
           "and the run waits for its writer forever", ("tests/test_cli.py",)),
    Mutant('suffix-search-counts-the-suffix-itself', 'minispec/chain/drafters.py',
           'for end in range(size - 2, -1, -1):', 'for end in range(size - 1, -1, -1):',
           'prompt lookup matches the context\'s own last token and proposes nothing new', ('tests/test_drafters.py',)),
    Mutant('ngram-order-oldest-first', 'minispec/chain/drafters.py',
           'return [end for n in range(max_ngram, min_ngram - 1, -1) for end, reach in matches if reach >= n]',
           'return [end for n in range(max_ngram, min_ngram - 1, -1) for end, reach in reversed(matches) if reach >= n]',
           'prompt lookup takes the oldest match instead of the most recent', ('tests/test_drafters.py',)),
    Mutant('library-names-reach-the-command-line', 'minispec/cli.py',
           '    if not flags:\n        return message\n', '    return message\n',
           'the CLI prints the API\'s argument names (draft=) instead of its flags', ('tests/test_bad_inputs.py',)),
    Mutant('policy-options-dropped', 'minispec/generate/run.py',
           '    options = policy_options(args)\n', '    options = {}\n',
           '--policy NAME:key=value parsed, then not passed to the policy', ('tests/test_cli.py',)),
    Mutant('multi-line-error', 'minispec/cli.py',
           "print(f\"{prog}: error: {in_flags(' '.join(str(err).splitlines()), flags or {})}\", file=sys.stderr)",
           'print(f"{prog}: error: {in_flags(str(err), flags or {})}", file=sys.stderr)',
           'an error message with a newline prints two lines', ('tests/test_cli.py',)),
    Mutant('cli-imports-torch-first', 'minispec/generate/__init__.py',
           'from minispec.cli import raise_if_interrupted, run_main\n',
           'import torch  # noqa\nfrom minispec.cli import raise_if_interrupted, run_main\n',
           'the CLI imports torch before run_main: Ctrl-C while it loads is a traceback', ('tests/test_cli.py',)),
    Mutant('float-prompt-ids-truncated', 'minispec/chain/loop.py',
           '    bad = next((t for t in prompt_ids if not is_int(t)), None)\n',
           '    bad = None\n',
           'prompt ids [1.7, 2.9] silently truncated to [1, 2]', ('tests/test_bad_inputs.py',)),
    Mutant('policy-options-unchecked', 'minispec/acceptance/base.py',
           '    if unknown:\n',
           '    if False:\n',
           "acceptance.get('exact', p=0.3) ends in a raw TypeError", ('tests/test_bad_inputs.py',)),
    Mutant("block-stop-ignores-leftover", "minispec/acceptance/block.py",
           "denominator = mass + (1 - w)  # [gamma-1]",
           "denominator = mass + 1  # [gamma-1]",
           "block verification's stop probability normalised without the prefix's leftover mass 1 - w_j",
           ("tests/test_policy_block.py",)),
    Mutant("block-residual-unweighted", "minispec/acceptance/block.py",
           "return residual_distribution(weights[tau] * p_target[tau].to(F64), q_draft[tau].to(F64))",
           "return residual_distribution(p_target[tau].to(F64), q_draft[tau].to(F64))",
           "block verification corrects from token-level's residual max(0, p - q) instead of max(0, w p - q)",
           ("tests/test_policy_block.py",)),
    Mutant("block-weights-uncapped", "minispec/acceptance/block.py",
           "weights.append(min(1.0, w * p / q) if q > 0",
           "weights.append(w * p / q if q > 0",
           "block verification's weights w_i allowed above 1 (the min(1, .) dropped)", ("tests/test_policy_block.py",)),
    Mutant("block-first-stop-wins", "minispec/acceptance/block.py",
           "return int(hits[-1]) + 1 if len(hits) else 0",
           "return int(hits[0]) + 1 if len(hits) else 0",
           "block verification reads tau forwards (the first j whose coin stops) instead of backwards",
           ("tests/test_policy_block.py",)),
    Mutant("traversal-weight-forgets-the-path", "minispec/trees/walks.py",
           "weight[c + 1] = child_weight(weight[v + 1],",
           "weight[c + 1] = child_weight(1.0,",
           "traversal verification weighs each node by its own ratio min(1, p/q), not the path's", ("tests/test_policy_traversal.py",)),
    Mutant("traversal-residual-unweighted", "minispec/trees/walks.py",
           "excess = (w_u * rows[u + 1] - q_draft[node]).clamp(min=0)",
           "excess = (rows[u + 1] - q_draft[node]).clamp(min=0)",
           "traversal verification's residual after a rejected subtree is max(0, P - Q), not max(0, w P - Q)",
           ("tests/test_policy_traversal.py",)),
    Mutant("traversal-stop-ignores-leftover", "minispec/trees/walks.py",
           "denominator = mass + 1.0 - w_u",
           "denominator = mass + 1.0",
           "traversal verification's new weight m / (m + 1) without the path's leftover mass 1 - w",
           ("tests/test_policy_traversal.py",)),
    Mutant("traversal-root-residual-kept", "minispec/trees/walks.py",
           "        if mass > 0:\n            rows[u + 1] = excess / mass",
           "        if mass > 0 and u >= 0:\n            rows[u + 1] = excess / mass",
           "traversal verification corrects at the root from p itself after every root child was rejected",
           ("tests/test_policy_traversal.py",)),
    Mutant("lenience-residual-unscaled", "minispec/acceptance/lenience.py",
           "next_token = correction_or_bonus(inp.p_target, q_scaled, num_accepted, inp.generator)",
           "next_token = correction_or_bonus(inp.p_target, inp.q_draft, num_accepted, inp.generator)",
           "lenience corrects from sampling's residual max(0, p - q) instead of max(0, p - beta q)",
           ("tests/test_policy_lenience.py",)),
    Mutant("lenience-beta-on-the-target", "minispec/acceptance/lenience.py",
           "accepted = sample_acceptances(inp.p_target, q_scaled, inp.draft_tokens, inp.generator)",
           "accepted = sample_acceptances(self.beta * inp.p_target, inp.q_draft, inp.draft_tokens, inp.generator)",
           "lenience scales p down instead of q: stricter than sampling, not more lenient",
           ("tests/test_policy_lenience.py",)),
    Mutant("ensemble-mix-reversed", "minispec/acceptance/ensemble.py",
           "mixed = (1 - weight) * q_draft + weight * p_target[:gamma]",
           "mixed = weight * q_draft + (1 - weight) * p_target[:gamma]",
           "the static ensemble weighs the draft by w and the target by 1 - w: the mixture the other way round",
           ("tests/test_policy_ensemble.py",)),
    Mutant("ensemble-accepts-against-p", "minispec/acceptance/ensemble.py",
           "accepted = sample_acceptances(v_target, inp.q_draft, inp.draft_tokens, inp.generator)",
           "accepted = sample_acceptances(inp.p_target, inp.q_draft, inp.draft_tokens, inp.generator)",
           "the static ensemble tests the draft against p, not v: it becomes speculative sampling",
           ("tests/test_policy_ensemble.py",)),
    Mutant("kl-judge-divergence-reversed", "minispec/acceptance/kl_judge.py",
           "divergence = kl_divergence(c, criterion_draft)  # [gamma]",
           "divergence = kl_divergence(criterion_draft, c)  # [gamma]",
           "the KL judge reads KL(draft || target) where its rule says KL(target || draft)",
           ("tests/test_policy_kl_judge.py",)),
    Mutant("kl-judge-no-confidence-mask", "minispec/acceptance/kl_judge.py",
           "unsure = c.max(dim=-1).values <= confidence  # [gamma]",
           "unsure = torch.ones(gamma, dtype=torch.bool)  # [gamma]",
           "the KL judge drops the confidence mask: it overrides the base where the target is sure",
           ("tests/test_policy_kl_judge.py",)),
    Mutant("kl-judge-keeps-a-ruled-out-token", "minispec/acceptance/kl_judge.py",
           "return (divergence < threshold) & unsure & has_mass",
           "return (divergence < threshold) & unsure",
           "the KL judge keeps a draft token the target gives no mass (masked by top-k or top-p)",
           ("tests/test_policy_kl_judge.py",)),
    Mutant("distortion-form-ignores-the-base", "minispec/acceptance/distortion/forms.py",
           "accept_draws = either(base.accept.unsqueeze(0), draws)  # [M, V]",
           "accept_draws = draws  # [M, V]",
           "DropMatch's form counts only the masks' verdict and forgets that the base accepts too",
           ("tests/test_distortion.py",)),
    Mutant("distortion-lenience-form-unscaled-residual", "minispec/acceptance/distortion/forms.py",
           "return Form(ratio_acceptance(p_row, scaled), residual_distribution(p_row, scaled))",
           "return Form(ratio_acceptance(p_row, scaled), residual_distribution(p_row, q_row))",
           "lenience's form corrects from max(0, p - q) where the policy corrects from max(0, p - beta q)",
           ("tests/test_distortion.py",)),
    Mutant("distortion-meter-skips-the-last-row", "minispec/acceptance/distortion/meter.py",
           "for row in range(decision.num_accepted + 1):",
           "for row in range(decision.num_accepted):",
           "the meter leaves out the rejected (or bonus) row, where a lossy rule's correction distorts most",
           ("tests/test_distortion.py",)),
    Mutant("distortion-kl-direction", "minispec/acceptance/distortion/meter.py",
           "return max(0.0, float((torch.xlogy(p, p) - torch.xlogy(p, pi)).sum()))",
           "return max(0.0, float((torch.xlogy(pi, pi) - torch.xlogy(pi, p)).sum()))",
           "the meter reports KL(pi || p) under the name KL(p || pi)",
           ("tests/test_distortion.py",)),
    Mutant("multipath-residual-not-passed", "minispec/trees/walks.py",
           "        row = residual / mass if mass > 0 else row  # mass 0: a stop of probability 0 (block.py's note)",
           "        row = targets[tau]",
           "multipath tests the next path against the target's row, not the residual the last path left: lossy",
           ("tests/test_policy_multipath.py",)),
    Mutant("multipath-one-path-only", "minispec/trees/walks.py",
           "        node = chain[tau - 1] if tau else node\n        untried[node + 1].remove(chain[tau])",
           "        return path, residual",
           "multipath stops after the first path's block verification: block verification, no gain",
           ("tests/test_policy_multipath.py",)),
    Mutant("weights-force-through-a-link", "minispec/checkpoints/fetch.py",
           "    if not dest.is_symlink():\n        return dest",
           "    if True:\n        return dest",
           "--force renames a symbolic link DEST and moves its target's other files into the new folder",
           ("tests/test_weights_faults.py",)),
    Mutant("gguf-token-types-partial", "minispec/checkpoints/gguf_checks.py",
           "if not isinstance(types, list) or len(types) != len(tokens) or not all(is_int(t) for t in types):",
           "if not isinstance(types, list) or len(types) > len(tokens) or not all(is_int(t) for t in types):",
           "the converter takes token types that cover only the first tokens: <|im_end|> becomes an ordinary token",
           ("tests/test_weights.py",)),
    Mutant("gguf-embedding-rows-trusted", "minispec/checkpoints/gguf_checks.py",
           "        if name in shapes and shapes[name] != (vocab, hidden):",
           "        if name in shapes and shapes[name][1] != hidden:",
           "the converter writes a vocabulary that does not match the embedding's rows; only the loader refuses it",
           ("tests/test_weights.py",)),
    Mutant("gguf-nan-scales-written", "minispec/checkpoints/gguf_checks.py",
           "    if not bool(torch.isfinite(weight).all()):",
           "    if False:",
           "a NaN block scale converts without a word into NaN weights",
           ("tests/test_weights.py",)),
    Mutant("tokenizer-share-unchecked", "minispec/generate/run.py",
           "    if tokens < SMALLEST_TOKENIZER_SHARE * rows:",
           "    if False:",
           "another model's tokenizer (a quarter of the embedding's rows) is accepted and decodes garbage",
           ("tests/test_bad_inputs.py",)),
    Mutant("home-tilde-unchecked", "minispec/checkpoints/disk.py",
           "        return Path(value).expanduser()\n    except RuntimeError as error:",
           "        return Path(value).expanduser()\n    except KeyError as error:",
           "MINISPEC_HOME = ~nosuchuser/... ends in a RuntimeError traceback",
           ("tests/test_bad_inputs.py",)),
    Mutant("frequent-head-ids-dropped", "minispec/kernels/frequent_head.py",
           "    outside = tensor[(tensor < 0) | (tensor >= vocab)]\n    if outside.numel():",
           "    outside = tensor[(tensor < 0) | (tensor >= vocab)]\n    if False:",
           "frequent_head.apply takes ids outside the vocabulary (an index error later, or rows silently dropped)",
           ("tests/test_kernels_frequent_head.py",)),
    Mutant("stdin-closed-unchecked", "minispec/generate/run.py",
           "    if sys.stdin is None or getattr(sys.stdin, \"closed\", False):",
           "    if False:",
           "--prompt-file - with no standard input ends in an AttributeError traceback",
           ("tests/test_bad_inputs.py",)),
    Mutant("empty-prompt-unnamed", "minispec/generate/run.py",
           "    if not ids:\n        raise MinispecError(f\"{where}:",
           "    if False:\n        raise MinispecError(f\"{where}:",
           "an empty --raw prompt is blamed on prompt_ids, a name the user never typed",
           ("tests/test_bad_inputs.py",)),
    Mutant("config-folder-not-found", "minispec/model/config.py",
           "            if path.is_dir():\n                raise ConfigError(f\"{path}: a folder;",
           "            if False:\n                raise ConfigError(f\"{path}: a folder;",
           "a config.json that is a folder is reported as 'file not found'",
           ("tests/test_bad_inputs.py",)),
    Mutant("fly-window-past-the-tokens", "minispec/generate/flags.py",
           "and isinstance(window, int) and window >= most_drafts:",
           "and isinstance(window, int) and window > 10**9:",
           "a FLy window no step of --max-new-tokens can hold runs as exact match without a word",
           ("tests/test_bad_inputs.py",)),
    Mutant("decision-tensor-kept", "minispec/acceptance/base.py",
           "        decision.next_token = as_index(self.name, \"next_token\", decision.next_token)\n",
           "",
           "a policy's 0-d tensor next token reaches the loop, where it never equals an eos id",
           ("tests/test_policy_base.py",)),
    Mutant("check-policy-misses-in-place-edits", "minispec/testing/checks.py",
           "            assert torch.equal(getattr(inp, name), value),",
           "            assert True or torch.equal(getattr(inp, name), value),",
           "check_policy passes a policy that edits p_target in place",
           ("tests/test_testing.py",)),
    Mutant("option-numpy-float-refused", "minispec/acceptance/base.py",
           "    if kind is float and isinstance(value, numbers.Real) and not isinstance(value, bool):",
           "    if kind is float and isinstance(value, float):",
           "a numpy float32 option (p = np.float32(0.3)) is refused as a non-float",
           ("tests/test_policy_base.py",)),
    Mutant("fly-window-reaches-the-bonus", "minispec/acceptance/fly.py",
           "for i in range(gamma - window):  # i + W < gamma",
           "for i in range(gamma - window + 1):",
           "FLy defers a rejection whose window runs past the draft (one position short of W)",
           ("tests/test_policy_fly.py",)),
    Mutant("fly-entropy-renormalised", "minispec/acceptance/fly.py",
           "    return -torch.xlogy(top, top).sum(dim=-1)",
           "    top = top / top.sum(dim=-1, keepdim=True)\n    return -torch.xlogy(top, top).sum(dim=-1)",
           "FLy's top-k entropy computed over the k renormalised (vLLM reads them as they are)",
           ("tests/test_policy_fly.py",)),
    Mutant("fly-masked-token-deferred", "minispec/acceptance/fly.py",
           "return ~base & (entropy >= threshold) & has_mass & window_ok",
           "return ~base & (entropy >= threshold) & window_ok",
           "FLy accepts a draft the target gives probability 0 (masked by top-k / top-p)",
           ("tests/test_policy_fly.py",)),
    Mutant("fly-greedy-entropy-of-one-hot", "minispec/acceptance/fly.py",
           "criterion = torch.softmax(inp.target_logits[:gamma].to(F64), dim=-1)  # [gamma, V]",
           "criterion = inp.p_target[:gamma].to(F64)  # [gamma, V]",
           "FLy at T = 0 reads the one-hot p_target's entropy (always 0): it never defers",
           ("tests/test_policy_fly.py",)),
    Mutant("top-p-drops-the-crossing-token", "minispec/model/sampling.py",
           "drop_sorted = mass_greater >= params.top_p",
           "drop_sorted = mass_greater + sorted_probs > params.top_p",
           "the nucleus keeps only tokens whose mass with theirs stays within top_p: the token that crosses "
           "top_p is dropped", ("tests/test_sampling_reference.py",)),
    Mutant("top-p-ties-split-by-sort-order", "minispec/model/sampling.py",
           "mass_greater = mass_before.gather(-1, first_of_tie)",
           "mass_greater = mass_before",
           "tied tokens at the top-p boundary kept or dropped by the order the sort gave them",
           ("tests/test_sampling_reference.py",)),
    Mutant("top-p-before-temperature", "minispec/model/sampling.py",
           "sorted_probs = sorted_logits.softmax(dim=-1)",
           "sorted_probs = (sorted_logits * params.temperature).softmax(dim=-1)",
           "the nucleus taken on softmax(logits), before the temperature", ("tests/test_sampling_reference.py",)),
    Mutant("top-k-one-short", "minispec/model/sampling.py",
           "kth_largest = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]",
           "kth_largest = torch.topk(logits, max(params.top_k - 1, 1), dim=-1).values[..., -1:]",
           "top-k keeps k - 1 tokens (an off-by-one in the count)", ("tests/test_sampling_reference.py",)),
    Mutant("chat-generation-prompt-always", "minispec/checkpoints/tokenizer.py",
           "return self.encode(self.render_chat(messages, add_generation_prompt, **variables))",
           "return self.encode(self.render_chat(messages, True, **variables))",
           "apply_chat_template ignores add_generation_prompt=False", ("tests/test_tokenizer.py",)),
    Mutant("eos-on-the-last-accepted-draft", "minispec/chain/loop.py",
           "    if num_committed <= num_accepted:",
           "    if num_committed < num_accepted:",
           "a step whose eos is exactly its last accepted draft counted as if it had emitted the bonus token",
           ("tests/test_stats.py",)),
    Mutant("tree-branching-beyond-gamma-ignored", "minispec/trees/drafters.py",
           "    if depth is not None and len(tree.branching) > depth:",
           "    if depth is not None and len(tree.branching) > depth + 1:",
           "a branching count deeper than the tree silently unused", ("tests/test_bad_inputs.py",)),
    Mutant("prompt-lines-at-unicode-separators", "minispec/generate/run.py",
           '    lines = text.split("\\n")\n',
           '    lines = text.splitlines() + [""]\n',
           "a prompt file split with str.splitlines: U+2028, U+0085 and form feeds end a prompt too",
           ("tests/test_bad_inputs.py",)),
    Mutant("prompt-file-bom-kept", "minispec/generate/run.py",
           '    return text.removeprefix("\\ufeff")',
           "    return text",
           "a UTF-8 byte-order mark becomes part of the first prompt", ("tests/test_bad_inputs.py",)),
    Mutant("lazy-js-at-its-own-temperature", "minispec/acceptance/dropmatch/lazy.py",
           "            temperature = self.js_temperature if inp.params.greedy else inp.params.temperature",
           "            temperature = self.js_temperature",
           "the lazy DropMatch's JS test at js_temperature while sampling at another temperature (eager differs)",
           ("tests/test_policy_dropmatch.py",)),
    Mutant("nan-weights-accepted", "minispec/checkpoints/load.py",
           "                if not bool(torch.isfinite(tensor).all()):",
           "                if bool(torch.isinf(tensor).any()):",
           "a checkpoint's NaN weights loaded (only inf refused): greedy 'generates' token 0",
           ("tests/test_bad_inputs.py",)),
    Mutant("probe-answer-not-kept", "minispec/kernels/__init__.py",
           "        probe_cache.store(question, kind)\n",
           "",
           "--draft-kernels auto measures anew each run: a close race may pick another kind, and the same seed other text",
           ("tests/test_kernels_probe_cache.py",)),
    Mutant("probe-answer-trusted", "minispec/kernels/probe_cache.py",
           "    return answer if answer in answers else None",
           "    return answer",
           "a stored kind outside the candidates (another build's, a hand edit) is used without a check",
           ("tests/test_kernels_probe_cache.py",)),
]


def copy_project(dest: Path) -> None:
    for name in ("minispec", "tests", "scripts", "docs", ".ci"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    (dest / "weights").symlink_to(ROOT / "weights")  # the converted checkpoint, shared read-only


# Test files that load the real checkpoint or run many generations go last, so that a mutant
# the fast tiny-model properties catch is killed in seconds. Every file still runs.
SLOW_LAST = ("test_testing.py", "test_readme.py", "test_cli.py", "test_real_checkpoint.py",
             "test_transformers_equivalence.py")


# The catalogue's own test reads the source for each mutant's target text: under a mutant that text
# is gone by construction, so it would "kill" every mutant the other tests miss. It is left out.
NOT_RUN = ("test_mutation_catalogue.py",)


def test_files(workdir: Path) -> list[str]:
    files = sorted(p.name for p in (workdir / "tests").glob("test_*.py") if p.name not in NOT_RUN)
    order = [f for f in files if f not in SLOW_LAST] + [f for f in SLOW_LAST if f in files]
    return [f"tests/{f}" for f in order]


def run_suite(workdir: Path, timeout: float, first: tuple[str, ...] = ()) -> tuple[bool, str, float]:
    """(passed, first failing test or '', seconds). `first`: test files to run before the rest."""
    env = {**os.environ, "MINISPEC_PROFILE": "mutation", "PYTHONDONTWRITEBYTECODE": "1"}
    files = [*first, *(f for f in test_files(workdir) if f not in first)]
    # the real pair's tests (marker `pair`) need an optional 9 GB download that CI does not make: every
    # mutant must be killed by the suite CI runs, so they are left out even where the pair is present
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not pair", *files]
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
                passed, failed, seconds = run_suite(workdir, args.timeout, m.first)
            finally:
                path.write_text(pristine)
            killed += not passed
            print(f"{m.name:36s} {('SURVIVED' if passed else failed)[:72]:72s} {seconds:5.0f}s", flush=True)
        print(f"killed {killed} of {len(mutants)} mutants")
        return 0 if killed == len(mutants) else 1


if __name__ == "__main__":
    sys.exit(main())
