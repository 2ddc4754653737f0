"""The invariants an acceptance step must keep, each a named check with an exact or a statistical test.

    claimed_distribution   T = 1: the step's output follows what the engine claims (lossless: p;
                           the static ensemble: (1 - w) q + w p), chi-square with its control
    accepted_length        T = 1: the accepted length follows its closed form,
                           P(n = k) = a_1 ... a_k (1 - a_{k+1}), a_i = accepts(c_i, q_i)
    both_sides_processed   T = 0.6, top-k 3, top-p 0.95: the same, against the distributions after
                           temperature and filters applied to both sides alike
    judged_as_sampled      logits near 300 in float32: the draft is judged with the q it was
                           sampled from (an engine that rounds the logits, e.g. to bfloat16, does not)
    filtered_slices        T = 1.5 with top-p 0.7, T = 2 with top-k 2 and top-p 0.8: the claim where
                           the filters remove tokens from every row
    greedy                 T = 0: exactly the target's argmax tokens, every draft of a small
                           vocabulary enumerated, each its drafter's argmax (exact, no statistics)
    zero_probability       no emitted token has target probability 0 (a token the target masks)
    seeded                 the same inputs and generator seed give the same decision
    batch_independent      with a batch form: a row's decision is the one it gets alone
    constrained            a grammar mask along the drafted path (grammar.py), on both sides and on
                           the target only: which law the first emitted token follows, the locally
                           projected one (what the claim gives on the masked rows) or the
                           grammar-conditional one; FAIL for neither, or for a token the grammar forbids

A proposing engine (contract.py) draws its own drafts; the suite then reads its emitted tokens
instead of extending the suite's drafts, and every check above applies unchanged.

How a step is observed (the statistical ones). The target and draft rows are fixed whatever came
before (a target whose next-token distribution ignores the context is still a target, and a
lossless rule must be lossless for it). The suite samples d_i ~ q_i, runs the step and extends
its output to gamma + 1 tokens: (d_1 .. d_n, next_token, f_{n+1} .. f_gamma), f_j drawn from the
claimed c_j (p_gamma at the bonus position). If the claim holds, this sequence follows the
product c_0 x ... x c_{gamma-1} x p_gamma exactly; the chi-square tests the counts of all
V^(gamma+1) sequences against it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import product

import torch

from minispec.checks import is_int
from minispec.errors import MinispecError
from minispec.testing.conform import stats
from minispec.testing.conform.contract import Broken, Engine, StepInput, StepOutput, step_input
from minispec.testing.conform.grammar import MASKED, TOY, Grammar


@dataclass(frozen=True)
class Budget:
    """How hard the statistical checks look: a bias of total variation `delta` in what they test
    must be detected with probability stats.MIN_POWER, with samples from `start` doubling up to `limit`."""

    delta: float = 0.05
    start: int = 4000
    limit: int = 64000
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.delta, bool) or not isinstance(self.delta, (int, float)) or not 0 < self.delta < 0.5:
            raise MinispecError(f"Budget: delta = {self.delta!r}; expected a total variation in (0, 0.5)")
        for name, lo, hi in (("start", 1, 10**7), ("limit", self.start if is_int(self.start) else 1, 10**7),
                             ("seed", 0, 2**63 - 1)):
            value = getattr(self, name)
            if not is_int(value) or not lo <= value <= hi:
                raise MinispecError(f"Budget: {name} = {value!r}; expected an integer in {lo}..{hi}")


@dataclass
class Verdict:
    invariant: str
    status: str  # "pass", "FAIL" or "n/a"
    evidence: str
    fit: stats.Fit | None = None
    control: stats.Control | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status != "FAIL"


def logits(rows: int, vocab: int, generator: torch.Generator, scale: float = 1.5, offset: float = 0.0) -> torch.Tensor:
    return (torch.randn(rows, vocab, generator=generator, dtype=torch.float64) * scale + offset).float()  # [rows, V]


def call(engine: Engine, inp: StepInput) -> StepOutput:
    """engine(inp): its output checked against the contract (Broken otherwise)."""
    return engine(inp)


@dataclass
class Setting:
    """One fixed step's tensors: the logits, the sampling parameters, the reference distributions."""

    target_logits: torch.Tensor  # [gamma+1, V]
    draft_logits: torch.Tensor  # [gamma, V]
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        drafts = torch.zeros(self.draft_logits.shape[0], dtype=torch.long)
        self.reference = step_input(self.target_logits, self.draft_logits, drafts, torch.Generator(),
                                    self.temperature, self.top_k, self.top_p)  # p_target, q_draft in float64

    def input(self, drafts: torch.Tensor, seed: int) -> StepInput:
        """The step on `drafts` with a generator seeded `seed`; every tensor a copy of its own, so an
        engine that writes into its inputs cannot change the next step's."""
        ref = self.reference
        return StepInput(self.target_logits.clone(), self.draft_logits.clone(), drafts.clone(),
                         torch.Generator().manual_seed(seed), self.temperature, self.top_k, self.top_p,
                         p_target=ref.p_target.clone(), q_draft=ref.q_draft.clone())


CHUNK = 1000  # steps per batch call in `observe`


def decide(engine: Engine, inputs: list[StepInput]) -> list[StepOutput]:
    """The engine's decisions on `inputs`: one batch call where it has a batch form, else one call each."""
    return engine.batch(inputs) if engine.batch_step is not None else [call(engine, i) for i in inputs]


def step_seed(seed: int, s: int) -> int:
    """The generator seed of step s of a run seeded `seed`: distinct per step, below 2**64 (what a
    torch.Generator takes) for every seed a Budget takes."""
    return (seed * 1_000_003 + s) % 2**64


def observe(engine: Engine, setting: Setting, samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the step `samples` times: counts of the extended output sequences [V^(gamma+1)] and of
    the accepted lengths [gamma+1]. Each step has its own generator, so a batch form gives the same
    counts as single calls wherever its rows are independent (batch_independent checks that)."""
    ref = setting.reference
    p, q = ref.p_target, ref.q_draft  # [gamma+1, V], [gamma, V]
    gamma, vocab = q.shape
    claimed = torch.stack([engine.claim(p[i], q[i]) for i in range(gamma)] + [p[gamma]]).float()  # [gamma+1, V]
    generator = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(q.float(), samples, replacement=True, generator=generator).T  # [samples, gamma]
    fills = torch.multinomial(claimed, samples, replacement=True, generator=generator).T  # [samples, gamma+1]
    sequences = torch.zeros(vocab ** (gamma + 1), dtype=torch.long)
    lengths = torch.zeros(gamma + 1, dtype=torch.long)
    weights = vocab ** torch.arange(gamma, -1, -1)  # [gamma+1]: a sequence's index, base V
    outputs: list[StepOutput] = []
    for start in range(0, samples, CHUNK):  # an engine with a batch form decides a chunk in one call
        inputs = [setting.input(drafts[s], step_seed(seed, s)) for s in range(start, min(samples, start + CHUNK))]
        outputs += decide(engine, inputs)
    for s, out in enumerate(outputs):
        seq = fills[s].clone()
        seq[: out.num_accepted + 1] = torch.tensor(out.tokens(drafts[s]))
        sequences[int((seq * weights).sum())] += 1
        lengths[out.num_accepted] += 1
    return sequences, lengths


def sequence_probs(engine: Engine, setting: Setting) -> torch.Tensor:
    """The claimed distribution of the extended output: c_0 x ... x c_{gamma-1} x p_gamma, [V^(gamma+1)]."""
    ref = setting.reference
    p, q = ref.p_target, ref.q_draft
    rows = [engine.claim(p[i], q[i]) for i in range(q.shape[0])] + [p[-1]]
    probs = rows[0]
    for row in rows[1:]:
        probs = torch.outer(probs, row).flatten()
    return probs


def length_probs(engine: Engine, setting: Setting) -> torch.Tensor:
    """P(num_accepted = k), k = 0..gamma, from the engine's closed-form acceptance a_i = accepts(c_i, q_i)."""
    ref = setting.reference
    p, q = ref.p_target, ref.q_draft
    a = torch.stack([engine.accept(engine.claim(p[i], q[i]), q[i]) for i in range(q.shape[0])])  # [gamma]
    reach = torch.cat([torch.ones(1, dtype=a.dtype), torch.cumprod(a, 0)])  # P(n >= k), k = 0..gamma
    return reach - torch.cat([reach[1:], torch.zeros(1, dtype=a.dtype)])


def fit_verdict(name: str, counts: torch.Tensor, probs: torch.Tensor, control: stats.Control, what: str) -> Verdict:
    fit = stats.chi_square(counts, probs)
    evidence = (f"chi2 {fit.statistic:.1f} on {fit.dof} dof, p = {fit.p_value:.2g}, N = {fit.samples}; "
                f"control: power {control.power:.1%} against a bias of TV {control.delta}, "
                f"false alarm {control.false_alarm:.1%} ({control.reps} reps, alpha {stats.ALPHA:g})")
    if control.power < stats.MIN_POWER:
        return Verdict(name, "FAIL", f"cannot tell: its control is caught only {control.power:.1%} of the time; "
                       + evidence, fit, control)
    if fit.p_value < stats.ALPHA:
        return Verdict(name, "FAIL", f"{what} does not hold: " + evidence, fit, control)
    return Verdict(name, "pass", evidence, fit, control)


def statistical(name: str, engine: Engine, setting: Setting, budget: Budget, what: str,
                lengths_too: bool = False) -> list[Verdict]:
    probs = sequence_probs(engine, setting)
    samples, control = stats.samples_for_power(probs, budget.delta, budget.start, budget.limit, budget.seed)
    length = None
    if lengths_too:
        lprobs = length_probs(engine, setting)
        lsamples, lcontrol = stats.samples_for_power(lprobs, budget.delta, budget.start, budget.limit, budget.seed)
        if lsamples > samples:
            samples, control = lsamples, stats.control(probs, lsamples, budget.delta, budget.seed)
        elif lsamples < samples:
            lcontrol = stats.control(lprobs, samples, budget.delta, budget.seed)
        length = (lprobs, lcontrol)
    try:
        sequences, lengths = observe(engine, setting, samples, budget.seed)
    except Broken as err:
        return [Verdict(name, "FAIL", str(err))] + ([Verdict("accepted_length", "FAIL", str(err))] if length else [])
    verdicts = [fit_verdict(name, sequences, probs, control, what)]
    if length:
        verdicts.append(fit_verdict("accepted_length", lengths, length[0], length[1],
                                    "P(n = k) = a_1 ... a_k (1 - a_{k+1})"))
    return verdicts


def settings(seed: int) -> dict[str, Setting]:
    """The fixed steps the statistical checks run on, drawn from `seed`."""
    g = torch.Generator().manual_seed(seed)
    return {
        "claimed": Setting(logits(3, 4, g), logits(2, 4, g)),  # gamma 2, V 4: 64 sequences
        # the draft favours tokens that the filters keep on its side but not on the target's, so an
        # engine that processes one side only is off by a total variation of ~0.13-0.19 here
        "processed": Setting(torch.cat([torch.tensor([[1.0, 0.5, 0.0, 0.8, -1.0]]) + logits(1, 5, g, scale=0.3),
                                        logits(1, 5, g)]),
                             torch.tensor([[0.0, 1.0, 0.5, 1.2, 0.8]]) + logits(1, 5, g, scale=0.3), 0.6, 3, 0.95),
        "rounding": Setting(logits(2, 4, g, scale=1.5, offset=300.0), logits(1, 4, g, scale=1.5, offset=300.0)),
    }


def check_claimed(engine: Engine, budget: Budget) -> list[Verdict]:
    if not engine.samples:
        return [Verdict("claimed_distribution", "n/a", "greedy only"), Verdict("accepted_length", "n/a", "greedy only")]
    if engine.claims is None:
        return [Verdict("claimed_distribution", "n/a", "states no output distribution"),
                Verdict("accepted_length", "n/a", "states no output distribution")]
    out = statistical("claimed_distribution", engine, settings(budget.seed)["claimed"], budget,
                      "the claimed output distribution", lengths_too=engine.accepts is not None)
    if engine.accepts is None:
        out.append(Verdict("accepted_length", "n/a", "states no closed-form acceptance"))
    return out


def check_processed(engine: Engine, budget: Budget) -> list[Verdict]:
    if not engine.samples or engine.claims is None:
        return [Verdict("both_sides_processed", "n/a", "greedy only" if not engine.samples else
                        "states no output distribution")]
    return statistical("both_sides_processed", engine, settings(budget.seed)["processed"], budget,
                       "the claim at T = 0.6, top-k 3, top-p 0.95 (both sides processed alike)")


def check_rounding(engine: Engine, budget: Budget) -> list[Verdict]:
    if not engine.samples or engine.claims is None:
        return [Verdict("judged_as_sampled", "n/a", "greedy only" if not engine.samples else
                        "states no output distribution")]
    return statistical("judged_as_sampled", engine, settings(budget.seed)["rounding"], budget,
                       "the claim on float32 logits near 300 (judged with the q sampled from)")


SLICES = ((1.5, None, 0.7), (2.0, 2, 0.8))  # (temperature, top-k, top-p): filters that remove tokens here


def check_slices(engine: Engine, budget: Budget) -> list[Verdict]:
    """The claim at temperatures far from 1 with top-k and top-p that remove tokens from every row (at
    top-p 0.95 few are removed, so a filter applied where it should not be, e.g. to the residual,
    goes unseen there)."""
    if not engine.samples or engine.claims is None:
        return [Verdict("filtered_slices", "n/a", "greedy only" if not engine.samples else
                        "states no output distribution")]
    g = torch.Generator().manual_seed(budget.seed + 5)
    evidence = []
    for temperature, top_k, top_p in SLICES:
        setting = Setting(logits(3, 5, g), logits(2, 5, g), temperature, top_k, top_p)
        what = f"the claim at T = {temperature:g}, top-k {top_k}, top-p {top_p:g}"
        verdict, = statistical("filtered_slices", engine, setting, budget, what)
        if verdict.status == "FAIL":
            verdict.evidence = f"{what}: {verdict.evidence}"
            return [verdict]
        evidence.append(f"{what}: {verdict.evidence}")
    return [Verdict("filtered_slices", "pass", "; ".join(evidence))]


def check_greedy(engine: Engine, budget: Budget) -> list[Verdict]:
    if not engine.greedy:
        return [Verdict("greedy", "n/a", "claims no greedy equivalence (" + (engine.note or "no T = 0 mode") + ")")]
    g = torch.Generator().manual_seed(budget.seed + 1)
    gamma, vocab = 3, 5
    target, noise = logits(gamma + 1, vocab, g), logits(gamma, vocab, g)
    argmax = target.argmax(-1)  # [gamma+1]
    checked = 0
    for drafts in product(range(vocab), repeat=gamma):
        drafts = torch.tensor(drafts)
        # a greedy drafter proposes its own argmax: q_draft is one-hot at each drafted token
        setting = Setting(target, noise + 10.0 * torch.nn.functional.one_hot(drafts, vocab), temperature=0.0)
        want_n = int((drafts == argmax[:gamma]).long().cumprod(0).sum())
        want = argmax[: want_n + 1].tolist()  # the emitted tokens: the target's own argmax run
        for seed in (0, 1):
            try:
                got = call(engine, setting.input(drafts, seed))
            except Broken as err:
                return [Verdict("greedy", "FAIL", f"drafts {drafts.tolist()}: {err}")]
            checked += 1
            if got.tokens(drafts) != want or got.num_accepted != want_n:
                return [Verdict("greedy", "FAIL", f"drafts {drafts.tolist()}, target argmax {argmax.tolist()}: "
                                f"expected {want_n} kept and the tokens {want}, got {got}")]
    return [Verdict("greedy", "pass", f"all {vocab}^{gamma} drafts x 2 seeds ({checked} steps) emit the argmax tokens")]


def check_zero_probability(engine: Engine, budget: Budget, samples: int = 500) -> list[Verdict]:
    g = torch.Generator().manual_seed(budget.seed + 2)
    gamma, vocab = 2, 4
    target = logits(gamma + 1, vocab, g)
    target[:, :2] = -1e4  # tokens 0 and 1 masked at every position (exp underflows to exactly 0)
    draft = logits(gamma, vocab, g)
    draft[:, 0] += 3.0  # the draft favours a masked token
    setting = Setting(target, draft, 1.0 if engine.samples else 0.0)
    ref = setting.reference
    gen = torch.Generator().manual_seed(budget.seed)
    drafts = torch.multinomial(ref.q_draft.float(), samples, replacement=True, generator=gen).T  # [samples, gamma]
    for s in range(samples):
        try:
            out = call(engine, setting.input(drafts[s], s))
        except Broken as err:
            return [Verdict("zero_probability", "FAIL", str(err))]
        emitted = out.tokens(drafts[s])
        for i, token in enumerate(emitted):
            if float(ref.p_target[i, token]) == 0.0:
                return [Verdict("zero_probability", "FAIL",
                                f"step {s}: emitted token {token} at position {i}, where the target gives it "
                                f"probability 0 (drafts {drafts[s].tolist()}, num_accepted {out.num_accepted})")]
    return [Verdict("zero_probability", "pass", f"{samples} steps with a masked token the draft favours: none emitted")]


def check_seeded(engine: Engine, budget: Budget, samples: int = 100) -> list[Verdict]:
    setting = settings(budget.seed)["claimed"]
    if not engine.samples:
        setting = Setting(setting.target_logits, setting.draft_logits, 0.0)
    gen = torch.Generator().manual_seed(budget.seed + 3)
    drafts = torch.multinomial(setting.reference.q_draft.float(), samples, replacement=True, generator=gen).T
    for s in range(samples):
        try:
            first, again = (call(engine, setting.input(drafts[s], 7 * s + 1)) for _ in range(2))
        except Broken as err:
            return [Verdict("seeded", "FAIL", str(err))]
        if first != again:
            return [Verdict("seeded", "FAIL", f"generator seed {7 * s + 1}, drafts {drafts[s].tolist()}: "
                            f"{first} then {again}")]
    return [Verdict("seeded", "pass", f"{samples} seeds, each run twice: the same decisions")]


def check_batch(engine: Engine, budget: Budget, batches: int = 50, rows: int = 4) -> list[Verdict]:
    if engine.batch_step is None:
        return [Verdict("batch_independent", "n/a", "no batch form")]
    g = torch.Generator().manual_seed(budget.seed + 4)
    temperature = 1.0 if engine.samples else 0.0
    for b in range(batches):
        inputs = []
        for r in range(rows):
            setting = Setting(logits(3, 4, g), logits(2, 4, g), temperature)
            drafts = torch.multinomial(setting.reference.q_draft.float(), 1, generator=g).squeeze(-1)  # [gamma]
            inputs.append((setting, drafts, 100 * b + r))
        try:
            together = engine.batch([s.input(d, seed) for s, d, seed in inputs])
            alone = [call(engine, s.input(d, seed)) for s, d, seed in inputs]
        except Broken as err:
            return [Verdict("batch_independent", "FAIL", str(err))]
        for r, (t, a) in enumerate(zip(together, alone)):
            if t != a:
                return [Verdict("batch_independent", "FAIL", f"batch {b}, row {r}: {t} in a batch of {rows}, "
                                f"{a} alone, with the same generator seed")]
    return [Verdict("batch_independent", "pass", f"{batches} batches of {rows}: every row decides as it does alone")]


def constrained_inputs(grammar: Grammar, target: torch.Tensor, draft: torch.Tensor, both_sides: bool,
                       generator: torch.Generator, seed: int) -> StepInput:
    """One step under `grammar`: d_i drawn from the draft's row i (masked along d_1..d_{i-1} when
    both_sides), the target's rows masked along the drafts, T = 1, a generator seeded `seed`."""
    drafts, state = [], grammar.start
    for i in range(draft.shape[0]):
        row = draft[i].double()
        if both_sides:
            row = row.masked_fill(~grammar.allowed(state, i), MASKED)
        drafts.append(int(torch.multinomial(torch.softmax(row, -1).float(), 1, generator=generator)))
        state = grammar.step(state, drafts[-1])
    drafts = torch.tensor(drafts)
    draft_rows = grammar.mask(draft, drafts) if both_sides else draft.clone()
    return step_input(grammar.mask(target, drafts), draft_rows, drafts, torch.Generator().manual_seed(seed))


def forbidden(grammar: Grammar, tokens: list[int]) -> str | None:
    """Where `tokens` (from position 0) leave the grammar, in words; None if they do not."""
    state = grammar.start
    for i, token in enumerate(tokens):
        if not grammar.allowed(state, i)[token]:
            return f"token {token} at position {i}, which the grammar forbids after {tokens[:i]}"
        state = grammar.step(state, token)
    return None


def constrained_rows(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The toy's unmasked rows: target [3, V], its token 3 at ~3% where the sentence 0 3 3 needs it
    (so the two laws part), and draft [2, V], favouring 0 first and 3 after."""
    g = torch.Generator().manual_seed(seed + 6)
    target = torch.tensor([[0.3, 0.0, 0.2, 0.0], [0.0, 0.2, 0.0, -2.5], [0.1, 0.0, 0.0, -2.5]]) + logits(3, 4, g, scale=0.1)
    draft = torch.tensor([[1.0, 0.0, 0.0, 0.5], [0.0, 0.0, 0.0, 1.0]]) + logits(2, 4, g, scale=0.1)
    return target, draft


def check_constrained(engine: Engine, budget: Budget) -> list[Verdict]:
    """The toy grammar (grammar.TOY) over a target that rarely says its token 3, masked on both sides
    and on the target only; each side's first emitted tokens tested against both laws."""
    if not engine.samples or engine.claims is None:
        return [Verdict("constrained", "n/a", "greedy only" if not engine.samples else "states no output distribution")]
    if engine.proposes:
        return [Verdict("constrained", "n/a", "draws its own drafts, so the suite cannot mask the rows along them")]
    grammar = TOY
    target, draft = constrained_rows(budget.seed)
    conditional = grammar.conditional_first(torch.softmax(target.double(), -1))  # [V]
    evidence = []
    for side, both_sides in (("both sides", True), ("target only", False)):
        first = constrained_inputs(grammar, target, draft, both_sides, torch.Generator(), 0)
        local = engine.claim(first.p_target[0], first.q_draft[0])  # the claim at position 0 on the masked rows
        samples, control = stats.samples_for_power(local, budget.delta, budget.start, budget.limit, budget.seed)
        generator, counts = torch.Generator().manual_seed(budget.seed), torch.zeros(grammar.vocab, dtype=torch.long)
        for start in range(0, samples, CHUNK):
            inputs = [constrained_inputs(grammar, target, draft, both_sides, generator, step_seed(budget.seed, s))
                      for s in range(start, min(samples, start + CHUNK))]
            try:
                outputs = decide(engine, inputs)
            except Broken as err:
                return [Verdict("constrained", "FAIL", f"{side}: {err}")]
            for inp, out in zip(inputs, outputs):
                tokens = out.tokens(inp.draft_tokens)
                where = forbidden(grammar, tokens)
                if where:
                    return [Verdict("constrained", "FAIL", f"{side}: neither law: emitted {where} (drafts "
                                    f"{inp.draft_tokens.tolist()}, num_accepted {out.num_accepted})")]
                counts[tokens[0]] += 1
        fits = {"locally projected": stats.chi_square(counts, local),
                "grammar-conditional": stats.chi_square(counts, conditional)}
        described = "; ".join(f"{law}: chi2 {f.statistic:.1f} on {f.dof} dof, p = {f.p_value:.2g}"
                              for law, f in fits.items())
        gap = 0.5 * float((local - conditional).abs().sum())
        detail = (f"N = {samples}, the laws {gap:.2f} apart in total variation, control power {control.power:.1%} "
                  f"against a bias of TV {control.delta}")
        if control.power < stats.MIN_POWER:
            return [Verdict("constrained", "FAIL", f"{side}: cannot tell: its control is caught only "
                            f"{control.power:.1%} of the time; {described}; {detail}")]
        held = [law for law, f in fits.items() if f.p_value >= stats.ALPHA]
        if len(held) != 1:
            return [Verdict("constrained", "FAIL", f"{side}: " + ("neither law" if not held else "both laws fit")
                            + f" ({described}; {detail})")]
        evidence.append(f"{side}: the {held[0]} law ({described}; {detail})")
    return [Verdict("constrained", "pass", "; ".join(evidence))]


CHECKS = {  # each check and the invariants it judges, in the report's order
    check_claimed: ("claimed_distribution", "accepted_length"),
    check_processed: ("both_sides_processed",),
    check_rounding: ("judged_as_sampled",),
    check_slices: ("filtered_slices",),
    check_greedy: ("greedy",),
    check_zero_probability: ("zero_probability",),
    check_seeded: ("seeded",),
    check_batch: ("batch_independent",),
    check_constrained: ("constrained",),
}
INVARIANTS = tuple(name for names in CHECKS.values() for name in names)


def conform(engine: Engine, budget: Budget = Budget(), only: tuple[str, ...] = ()) -> list[Verdict]:
    """Every invariant's verdict on `engine` (or those named in `only`), in INVARIANTS order.

    Runs with one torch thread (restored afterwards): a step's tensors are a few dozen numbers, and
    a thread pool only waits on itself there (10x slower per step on a busy 2-core machine)."""
    verdicts = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for check, names in CHECKS.items():
            if only and not set(only) & set(names):
                continue
            started = time.perf_counter()
            try:
                found = check(engine, budget)
            except Broken as err:  # what the engine raised or returned outside the contract, wherever it was
                found = [Verdict(name, "FAIL", str(err)) for name in names]
            for v in found:
                v.seconds = (time.perf_counter() - started) / len(found)
            verdicts += [v for v in found if not only or v.invariant in only]
    finally:
        torch.set_num_threads(threads)
    return verdicts


def assert_conforms(engine: Engine, budget: Budget = Budget(), only: tuple[str, ...] = ()) -> list[Verdict]:
    """conform() for a test suite: raises AssertionError naming every failed invariant with its
    evidence (the minimal case the check found); returns the verdicts when none failed."""
    verdicts = conform(engine, budget, only)
    failed = [v for v in verdicts if v.status == "FAIL"]
    if failed:
        raise AssertionError(f"{engine.name} breaks {len(failed)} invariant(s):\n"
                             + "\n".join(f"  {v.invariant}: {v.evidence}" for v in failed))
    return verdicts
