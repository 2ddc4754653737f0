"""scripts/dropmatch/dropmatch_replay.py: the recorded rows are the model's, and a replay decides as the
loop's DropMatch does on the same inputs with the same masks (tiny random models, float64)."""

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import dropmatch_replay  # noqa: E402

from minispec.acceptance.base import first_rejection  # noqa: E402
from minispec.acceptance.dropmatch.rule import CRITERIA, DropMatch  # noqa: E402
from minispec.model.sampling import SamplingParams  # noqa: E402
from minispec.chain.speculative import generate_chain as generate  # noqa: E402
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
        torch.testing.assert_close(model.head(rec.hidden), model(ids)[0, start:-1], rtol=0, atol=1e-12)
        for n in layers:  # early exit after block n: the first n blocks, the final norm (then the head)
            want = model.forward_hidden(ids, num_layers=n)[0, start:-1]
            torch.testing.assert_close(rec.exit_hidden[n], want, rtol=0, atol=1e-12)
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
            replaying.draw_masks(inp.hidden, inp.target_logits.shape[-1])
            continue
        rec = dropmatch_replay.Recording([], 0, inp.hidden[:g], {})
        verdicts = dropmatch_replay.replay(replaying, rec, inp.head, inp.draft_tokens, inp.draft_logits, inp.params,
                                           chunk=g, criteria=("js_or_majority", "js", "majority", "naive"),
                                           target_logits=inp.target_logits[:g])
        assert first_rejection(verdicts[f"accepted:{criterion}"]) == step.decision.num_accepted
        assert verdicts["base"].tolist() == (inp.draft_tokens == inp.target_logits[:g].argmax(-1)).tolist()
        # the JS test is "JS(q || pbar) <= radius": its two sides, as reported, decide it
        if criterion == "js" and not or_base:
            assert verdicts["accepted:js"].tolist() == (verdicts["js_draft"] <= verdicts["radius"]).tolist()
        if criterion == "naive":  # every criterion is judged on the same paths: naive accepts what majority does
            assert bool((verdicts["accepted:naive"] >= verdicts["accepted:majority"]).all())


def test_ngram_drafts_are_the_drafters_first_proposal_at_each_row():
    rec = dropmatch_replay.Recording([1, 2, 3, 1, 2, 3, 4], 2, torch.zeros(4, 1), {})
    # rows predict ids[3..6]; contexts ids[:3], ids[:4], ids[:5], ids[:6]
    assert dropmatch_replay.ngram_drafts(rec).tolist() == [-1, 2, 3, 1]


@settings(max_examples=15)
@given(cfg=model_configs(), seed=seeds, p=st.sampled_from([0.0, 0.1, 0.3, 0.6]), paths=st.integers(1, 6),
       majority=st.sampled_from(["strict", "plurality"]), chunk=st.integers(1, 7), one_hot=st.booleans(),
       rows=st.integers(1, 12))
def test_the_sweep_decides_as_the_literal_replay_on_the_same_masks(cfg, seed, p, paths, majority, chunk, one_hot, rows):
    """sweep (the JS sides computed once, every criterion and K from one set of paths) against
    replay (the policy's own verdicts): at K = K_max they draw the same masks and must agree on
    every verdict; at T = 1 DropMatch's own verdicts on the sweep's sampled draft tokens equal the
    policy's verdicts on those tokens."""
    model = random_model(cfg, seed, scale=3.0)
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, cfg.hidden_size, generator=gen, dtype=torch.float64)  # [n, d]
    draft_hidden = torch.randn(rows, cfg.hidden_size, generator=gen, dtype=torch.float64)
    tokens = model.head(draft_hidden).argmax(dim=-1)  # every row drafted: the sweep's chunks are the replay's
    draft = (dropmatch_replay.DraftRows(tokens) if one_hot
             else dropmatch_replay.DraftRows(tokens, draft_hidden, model.head))
    judged = dropmatch_replay.sweep(hidden, model.head, {"d": draft}, p, (paths,), (0.0, 1.0), majority, chunk, seed)
    policy = DropMatch(p=p, paths=paths, majority=majority, seed=seed)
    draft_logits = None if one_hot else model.head(draft_hidden)
    want = dropmatch_replay.replay(policy, dropmatch_replay.Recording([], 0, hidden, {}), model.head, tokens,
                                   draft_logits, chunk=chunk, criteria=CRITERIA)
    got = judged[(paths, "d", 0.0)]
    assert got["rows"].tolist() == (tokens >= 0).nonzero()[:, 0].tolist()
    for criterion in CRITERIA:
        assert (got[f"own:{criterion}"] | got["base"]).tolist() == want[f"accepted:{criterion}"].tolist(), criterion
    for key in ("base", "all_clean", "largest_vote"):
        assert got[key].tolist() == want[key].tolist(), key
    for key in ("js_draft", "radius"):
        torch.testing.assert_close(got[key], want[key], rtol=1e-12, atol=1e-15)
    # T = 1: the sampled tokens, judged by the policy itself on the same paths (K = K_max, same masks)
    hot = judged[(paths, "d", 1.0)]
    sampled = torch.full_like(tokens, -1)
    sampled[hot["rows"]] = hot["token"]
    again = dropmatch_replay.replay(DropMatch(p=p, paths=paths, majority=majority, seed=seed, or_base=False),
                                    dropmatch_replay.Recording([], 0, hidden, {}), model.head, sampled, draft_logits,
                                    SamplingParams(temperature=1.0), chunk=chunk, criteria=CRITERIA)
    if (sampled >= 0).tolist() == (tokens >= 0).tolist():  # the same chunks, so the same masks
        for criterion in CRITERIA:
            assert hot[f"own:{criterion}"].tolist() == again[f"accepted:{criterion}"].tolist(), criterion


def test_the_first_k_paths_of_a_sweep_are_a_k_path_dropmatch():
    """K < K_max: the first K of the K_max paths (the head agreement uses only those)."""
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(9, 6, generator=gen, dtype=torch.float64)
    head = lambda x: x @ weight.T  # noqa: E731
    hidden = torch.randn(5, 6, generator=gen, dtype=torch.float64)
    draft = dropmatch_replay.DraftRows(torch.tensor([0, -1, 2, 3, 4]))  # row 1: no draft (an n-gram miss)
    judged = dropmatch_replay.sweep(hidden, head, {"d": draft}, 0.4, (2, 4), (0.0,), chunk=5, seed=3)
    assert judged[(2, "d", 0.0)]["rows"].tolist() == [0, 2, 3, 4]
    paths = DropMatch(p=0.4, paths=4, seed=3).path_logits(torch.cat([hidden, hidden[-1:]]), head,
                                                          head(torch.cat([hidden, hidden[-1:]])))[:, :-1]
    first_two = paths[:2].argmax(dim=-1)  # [2, 5]
    clean = head(hidden).argmax(dim=-1)
    drafted = [0, 2, 3, 4]
    assert judged[(2, "d", 0.0)]["all_clean"].tolist() == (first_two == clean).all(dim=0)[drafted].tolist()
    assert judged[(4, "d", 0.0)]["all_clean"].tolist() == (paths.argmax(dim=-1) == clean).all(dim=0)[drafted].tolist()


def test_summarise_gives_the_papers_tables_2_and_3_pooled_over_prompts_with_a_bootstrap_interval():
    verdicts = {"rows": torch.tensor([0, 1, 3]), "base": torch.tensor([True, False, False]),
                "own:majority": torch.tensor([False, True, False]), "all_clean": torch.tensor([True, False, False]),
                "largest_vote": torch.tensor([3, 2, 1]), "js_draft": torch.tensor([0.0, 0.4, 0.6]),
                "radius": torch.tensor([0.1, 0.2, 0.4])}
    row_prompt = torch.tensor([0, 0, 1, 1])  # rows 0, 1 of prompt 0; rows 2, 3 of prompt 1 (row 2 undrafted)
    row = dropmatch_replay.summarise(verdicts, row_prompt, paths=3, criteria=("majority",), resamples=200)
    assert row["positions"] == 3 and row["base"] == 1 / 3 and row["accept"] == {"majority": 2 / 3}
    assert row["largest_vote"] == [1 / 3, 1 / 3, 1 / 3] and row["all_clean"] == 1 / 3 and row["dispersed"] == 2 / 3
    assert row["js_draft_concentrated"] == 0.0 and row["radius_concentrated"] == pytest.approx(0.1)
    assert row["js_draft_dispersed"] == pytest.approx(0.5) and row["radius_dispersed"] == pytest.approx(0.3)
    # the gain per prompt: prompt 0 gains 1 of 2 positions, prompt 1 0 of 1; resampled prompts give 0, 1/3 or 1/2
    low, high = row["gain_ci"]["majority"]
    assert 0 <= low <= high <= 0.5 and high > 0


def tiny_checkpoint(real_ckpt, folder, seed, **sizes):
    """The real checkpoint's tokenizer and config with a random small body (same vocabulary)."""
    import json
    import shutil

    from safetensors.torch import save_file

    from minispec.model.config import ModelConfig

    folder.mkdir()
    raw = json.loads((real_ckpt / "config.json").read_text())
    raw.update(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8, max_position_embeddings=4096, **sizes)
    (folder / "config.json").write_text(json.dumps(raw))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(real_ckpt / name, folder / name)
    model = random_model(ModelConfig.from_hf(raw), seed=seed, dtype=torch.float32, scale=3.0)
    save_file({"model." + k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
              folder / "model.safetensors")
    return folder


def test_a_separate_draft_models_rows_are_its_own_greedy_proposals(real_ckpt, tmp_path, capsys):
    """--draft-models: at every row of the fixed text the draft's token is the draft model's own
    argmax given the same context (one plain forward of that model), and the sweep reports it."""
    import json

    import minispec

    target = tiny_checkpoint(real_ckpt, tmp_path / "target", seed=0)
    draft = tiny_checkpoint(real_ckpt, tmp_path / "draft", seed=1)
    out = tmp_path / "out"
    code = dropmatch_replay.main(["--ckpt", str(target), "--draft-models", str(draft), "--sets", "rag:2",
                                  "--max-new-tokens", "5", "--ps", "0.3", "--paths", "5", "--criteria", "js_or_majority",
                                  "--temperatures", "0", "--exit-layers", "1", "--no-ngram", "--out", str(out),
                                  "--threads", "1"])
    assert code == 0, capsys.readouterr().err
    result = json.loads((out / "dropmatch_replay.json").read_text())
    assert "model:draft" in result["settings"]["drafters"]
    assert any(r["drafter"] == "model:draft" for r in result["rows"])

    tokenizer, target_model = minispec.load_tokenizer(target), minispec.load_model(target)
    draft_model = minispec.load_model(draft)
    prompts = dropmatch_replay.benchlib.load_prompts(["rag"], 2, tokenizer)
    texts = [generate(target_model, p.ids, max_new_tokens=5, eos_token_ids=list(tokenizer.eos_token_ids)).tokens
             for p in prompts]
    args = dropmatch_replay.build_parser().parse_args(["--draft-models", str(draft), "--exit-layers", "1",
                                                       "--no-ngram", "--self-drafts", "int8"])
    _, _, drafts = dropmatch_replay.pooled_rows(args, target, target_model, prompts, texts)
    expected = []
    for p, t in zip(prompts, texts):
        ids = p.ids + t
        with torch.inference_mode():
            logits = draft_model(torch.tensor([ids]))[0, len(p.ids) - 1:-1]  # [n, V]
        expected.append(logits.argmax(-1))
    assert torch.equal(drafts["model:draft"].tokens, torch.cat(expected))


def test_a_draft_model_with_another_vocabulary_is_one_line(real_ckpt, tmp_path, capsys):
    target = tiny_checkpoint(real_ckpt, tmp_path / "target", seed=0)
    draft = tiny_checkpoint(real_ckpt, tmp_path / "draft", seed=1, vocab_size=1000)
    code = dropmatch_replay.main(["--ckpt", str(target), "--draft-models", str(draft), "--sets", "rag:1",
                                  "--max-new-tokens", "3", "--ps", "0.3", "--paths", "5", "--temperatures", "0",
                                  "--exit-layers", "1", "--no-ngram", "--out", str(tmp_path / "out")])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "warning" not in line]
    assert code == 2 and len(err) == 1 and "--draft-models" in err[0] and "vocabulary of 1000" in err[0], err


def test_auto_p_reports_what_the_cli_would_pick_per_prompt_and_pooled(real_ckpt, tmp_path, capsys):
    """scripts/dropmatch/dropmatch_auto_p.py: each prompt's p is auto_dropout_p on the first 32 tokens of the
    cached greedy continuation; the pooled p reaches its level on the set's own positions."""
    import json

    import dropmatch_auto_p

    import minispec
    from minispec.lab.dropout_calibration import MeasuredAgreement, auto_dropout_p

    target = tiny_checkpoint(real_ckpt, tmp_path / "target", seed=0)
    out = tmp_path / "out"
    code = dropmatch_auto_p.main(["--ckpt", str(target), "--sets", "rag:2,gsm8k:1", "--max-new-tokens", "40",
                                  "--levels", "0.8", "--paths", "3", "--out", str(out), "--threads", "1"])
    assert code == 0, capsys.readouterr().err
    rows = json.loads((out / "dropmatch_auto_p.json").read_text())["rows"]
    assert [(r["set"], r["prompts"]) for r in rows] == [("rag", 2), ("gsm8k", 1)]
    model, tokenizer = minispec.load_model(target), minispec.load_tokenizer(target)
    prompts = dropmatch_replay.benchlib.load_prompts(["rag"], 2, tokenizer)
    texts = [generate(model, p.ids, max_new_tokens=40, eos_token_ids=list(tokenizer.eos_token_ids)).tokens
             for p in prompts]
    want = [auto_dropout_p(model, p.ids, 3, 0.8, continuation=t[:32]) for p, t in zip(prompts, texts)]
    assert rows[0]["p_per_prompt"] == pytest.approx(want, rel=1e-3)
    with torch.inference_mode():
        hidden = torch.cat([model.forward_hidden(torch.tensor([p.ids + t]))[0, len(p.ids) - 1:-1]
                            for p, t in zip(prompts, texts)])
    # bisection to 16 steps: the agreement at the pooled p is the level up to the bisection's width
    assert abs(MeasuredAgreement(hidden, model.head, 3)(rows[0]["p_pooled"]) - 0.8) < 0.1
    assert rows[0]["agreement_at_p"]["rag"] == pytest.approx(MeasuredAgreement(hidden, model.head, 3)(rows[0]["p_pooled"]))
