"""minispec.generate.trace: the --trace printer says what the loop did, with the loop's own numbers."""

import io
import re

from hypothesis import given, settings, strategies as st

from minispec.chain.speculative import generate_chain as generate
from minispec.testing import model_configs, random_model, seeds
from minispec.generate.trace import Tracer


class IdTokenizer:
    """Decodes ids as '<id>' so the trace can be read back exactly."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f"<{i}>" for i in ids)


@settings(max_examples=20)
@given(cfg=model_configs(), seed=seeds, gamma=st.integers(1, 4), temperature=st.sampled_from([0.0, 1.0]),
       policy=st.sampled_from(["exact", "sampling", "dropmatch"]), prompt=st.lists(st.integers(0, 4), min_size=2, max_size=12))
def test_the_trace_matches_the_loops_steps(cfg, seed, gamma, temperature, policy, prompt):
    out_text = io.StringIO()
    records = []

    def both(record):
        records.append(record)
        Tracer(IdTokenizer(), "ngram:2", policy, out=out_text)(record)

    target = random_model(cfg, seed, scale=3.0)
    out = generate(target, prompt, max_new_tokens=12, draft="ngram:2", policy=policy, gamma=gamma,
                   temperature=temperature, seed=seed, eos_token_ids=[], on_step=both)
    blocks = out_text.getvalue().split("step ")[1:]
    assert len(blocks) == len(records) == out.stats["verify_steps"]
    for block, record in zip(blocks, records):
        g, n = record.inp.gamma, record.decision.num_accepted
        assert f"proposed {g}\n" in block
        rows = re.findall(r"^  row (\d+) ", block, flags=re.M)
        assert rows == [str(i) for i in range(g + 1)]  # g draft rows and the bonus row
        verdicts = re.findall(r"(accepted|rejected|not reached)$", block, flags=re.M)
        assert verdicts == ["accepted"] * n + (["rejected"] + ["not reached"] * (g - n - 1) if n < g else [])
        token = f"'<{record.decision.next_token}>'"
        if g:
            assert f": {n} of {g} accepted; the {'correction' if n < g else 'bonus'} {token} comes from row {n}" in block
        else:
            assert f": nothing drafted; the target's token {token} comes from row 0" in block
        before, after = record.target_cache
        assert f"target cache {before} -> {after} " in block
        assert f"emitted '{''.join(f'<{t}>' for t in record.emitted)}'" in block
        if temperature == 0:  # the target's top on rows up to the decision is its argmax
            for i in range(min(n, g) + 1):
                best = int(record.inp.target_logits[i].argmax())
                assert re.search(rf"^  row {i} .*target's top '<{best}>'", block, flags=re.M)
