"""scripts/dropmatch_replay.py: the recorded rows are the model's, and a replay decides as the
loop's DropMatch does on the same inputs with the same masks (tiny random models, float64)."""

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import dropmatch_replay  # noqa: E402

from minispec.acceptance.base import first_rejection  # noqa: E402
from minispec.acceptance.dropmatch import DropMatch  # noqa: E402
from minispec.speculative import generate  # noqa: E402
from minispec.testing import model_configs, random_model, seeds  # noqa: E402


@settings(max_examples=10)
@given(cfg=model_configs(max_layers=3), seed=seeds, prompt=st.lists(st.integers(0, 5), min_size=1, max_size=8),
       continuation=st.lists(st.integers(0, 5), min_size=1, max_size=8))
def test_record_keeps_the_rows_of_one_plain_forward(cfg, seed, prompt, continuation):
    model = random_model(cfg, seed)
    layers = tuple(range(1, cfg.num_layers + 1))
    rec = dropmatch_replay.record(model, prompt, continuation, exit_layers=layers)
    ids = torch.tensor([prompt + continuation])
    start = len(prompt) - 1
    with torch.no_grad():
        torch.testing.assert_close(rec.target_logits, model(ids)[0, start:-1], rtol=0, atol=1e-12)
        for n in layers:  # early exit after block n: the first n blocks, the final norm, the head
            want = model.head(model.forward_hidden(ids, num_layers=n))[0, start:-1]
            torch.testing.assert_close(rec.exit_logits[n], want, rtol=0, atol=1e-12)
    assert rec.next_tokens == continuation and rec.hidden.shape[0] == len(continuation)


@settings(max_examples=15)
@given(cfg=model_configs(), seed=seeds, gamma=st.integers(1, 5), p=st.sampled_from([0.0, 0.1, 0.3, 0.6]),
       paths=st.integers(1, 6), criterion=st.sampled_from(["js_or_majority", "js", "majority", "naive"]),
       or_base=st.booleans(), draft=st.sampled_from(["ngram:2", "model"]),
       prompt=st.lists(st.integers(0, 4), min_size=2, max_size=12))
def test_replay_decides_as_the_loop_on_the_same_inputs(cfg, seed, gamma, p, paths, criterion, or_base, draft, prompt):
    """Each verify step of a real run, replayed in order by a policy seeded alike (so the same
    masks): per-position verdicts whose prefix is the loop's num_accepted."""
    target = random_model(cfg, seed, scale=3.0)
    drafter = random_model(cfg, seed + 1, scale=3.0) if draft == "model" else draft
    kwargs = dict(p=p, paths=paths, criterion=criterion, or_base=or_base, seed=seed)
    steps = []
    generate(target, prompt, max_new_tokens=12, draft=drafter, policy=DropMatch(**kwargs), gamma=gamma,
             eos_token_ids=[], on_step=steps.append)
    replaying = DropMatch(**kwargs)
    for step in steps:
        inp, g = step.inp, step.inp.gamma
        if g == 0:  # an n-gram miss: the loop's policy still drew this step's masks
            replaying.draw_masks(inp.hidden)
            continue
        rec = dropmatch_replay.Recording([], 0, inp.hidden[:g], inp.target_logits[:g], {})
        verdicts = dropmatch_replay.replay(replaying, rec, inp.head, inp.draft_tokens, inp.draft_logits, inp.params,
                                           chunk=g, criteria=("js_or_majority", "js", "majority", "naive"))
        assert first_rejection(verdicts[f"accepted:{criterion}"]) == step.decision.num_accepted
        assert verdicts["base"].tolist() == (inp.draft_tokens == inp.target_logits[:g].argmax(-1)).tolist()
        # the JS test is "JS(q || pbar) <= radius": its two sides, as reported, decide it
        if criterion == "js" and not or_base:
            assert verdicts["accepted:js"].tolist() == (verdicts["js_draft"] <= verdicts["radius"]).tolist()
        if criterion == "naive":  # every criterion is judged on the same paths: naive accepts what majority does
            assert bool((verdicts["accepted:naive"] >= verdicts["accepted:majority"]).all())


def test_ngram_drafts_are_the_drafters_first_proposal_at_each_row():
    rec = dropmatch_replay.Recording([1, 2, 3, 1, 2, 3, 4], 2, torch.zeros(4, 1), torch.zeros(4, 5), {})
    # rows predict ids[3..6]; contexts ids[:3], ids[:4], ids[:5], ids[:6]
    assert dropmatch_replay.ngram_drafts(rec).tolist() == [-1, 2, 3, 1]


def test_summarise_gives_the_papers_tables_2_and_3_pooled_over_prompts():
    one = {"base": torch.tensor([True, False]), "accepted:majority": torch.tensor([True, True]),
           "all_clean": torch.tensor([True, False]), "largest_vote": torch.tensor([3, 2]),
           "js_draft": torch.tensor([0.0, 0.4]), "radius": torch.tensor([0.1, 0.2])}
    two = {"base": torch.tensor([False]), "accepted:majority": torch.tensor([False]), "all_clean": torch.tensor([False]),
           "largest_vote": torch.tensor([1]), "js_draft": torch.tensor([0.6]), "radius": torch.tensor([0.4])}
    row = dropmatch_replay.summarise([one, two], paths=3)
    assert row["positions"] == 3 and row["base"] == 1 / 3 and row["accept"] == {"majority": 2 / 3}
    assert row["largest_vote"] == [1 / 3, 1 / 3, 1 / 3] and row["all_clean"] == 1 / 3 and row["dispersed"] == 2 / 3
    assert row["js_draft_concentrated"] == 0.0 and row["radius_concentrated"] == pytest.approx(0.1)
    assert row["js_draft_dispersed"] == pytest.approx(0.5) and row["radius_dispersed"] == pytest.approx(0.3)
