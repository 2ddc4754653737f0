"""What the loop counts: tau, acceptance, where drafts fail, and where the time goes.

Per verify step the loop records how many tokens were drafted (g), how many of them the policy
accepted (n), and how many tokens the step emitted (e): normally e = n + 1 (the accepted drafts,
then the correction or the bonus token). The one exception is the last step, when an eos or a stop
condition falls inside its accepted run: it emits only the e <= n drafts up to the end, and counts
as a draft of e tokens, all accepted (what came after the end was never emitted). So
sum e = generated tokens - 1 (the first one comes from the prefill) exactly. Over a generation:

    tau                       = sum e / steps               tokens per verify step, INCLUDING the
                                                            correction/bonus token: 1 <= tau <= gamma+1
                                                            (the convention of the DropMatch paper and vLLM)
    tau_drafted               = sum e / drafted steps, over the steps with g > 0
                                                            only: the mean accepted length as vLLM and
                                                            llama.cpp report it (a step where an n-gram
                                                            drafter found nothing is a plain decode step)
    acceptance_rate           = sum n / sum g
    per_position_acceptance[i] = P(draft i accepted | draft i was proposed): over the steps that
                                 drafted position i (a step that drafted 2 of gamma 5 counts for i = 0, 1)
    accepted_length_histogram[n] = number of steps WITH drafts that accepted exactly n of them
    no_draft_steps            = steps with g = 0 (not in the histogram: nothing was rejected there)
    finish_reason             = "eos" | "length" | "stop" (set by the loop)

vLLM's "mean acceptance length" and llama.cpp's "accepted / drafted" per step are tau_drafted and
acceptance_rate; their per-position rates are per_position_acceptance. minispec's own tau also
counts the steps without drafts, so that tau x (time per step) is the real decoding time.

A policy may report its own counts in Decision.info (DropMatch: how many tokens only it
accepted); every numeric entry is summed over the steps into `policy_info`.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from numbers import Number


class StepStats:
    """Counts per verify step; `summary()` turns them into the figures above."""

    def __init__(self, gamma: int) -> None:
        self.gamma = gamma
        self.num_steps = 0
        self.drafted_steps = 0  # steps with at least one draft token
        self.num_drafted = 0
        self.num_accepted = 0
        self.num_emitted = 0
        self.emitted_in_drafted_steps = 0
        self.proposed_at = [0] * gamma  # how often position i (0-based) was drafted
        self.accepted_at = [0] * gamma  # ... and accepted
        self.histogram = [0] * (gamma + 1)  # steps with drafts, by number of accepted drafts
        self.policy_info: dict[str, Number] = {}  # totals of the policies' numeric Decision.info

    def record(self, num_drafted: int, num_accepted: int, info: dict, num_emitted: int | None = None) -> None:
        """One verify step: g drafted, n accepted, e emitted (default n + 1; see the module docstring)."""
        num_emitted = num_accepted + 1 if num_emitted is None else num_emitted
        self.num_steps += 1
        self.drafted_steps += num_drafted > 0
        self.num_drafted += num_drafted
        self.num_accepted += num_accepted
        self.num_emitted += num_emitted
        self.emitted_in_drafted_steps += num_emitted if num_drafted > 0 else 0
        if num_drafted > 0:
            self.histogram[num_accepted] += 1
        for i in range(num_drafted):
            self.proposed_at[i] += 1
            self.accepted_at[i] += i < num_accepted
        for key, value in info.items():
            if isinstance(value, Number) and not isinstance(value, bool):
                self.policy_info[key] = self.policy_info.get(key, 0) + value

    def summary(self) -> dict:
        return {
            "verify_steps": self.num_steps,
            # emitted per step = accepted drafts + 1 correction/bonus token (fewer only if the run ended inside it)
            "tau": self.num_emitted / self.num_steps if self.num_steps else 1.0,
            "drafted_steps": self.drafted_steps,
            # the same over the steps that drafted something (vLLM's and llama.cpp's mean accepted length)
            "tau_drafted": self.emitted_in_drafted_steps / self.drafted_steps if self.drafted_steps else None,
            "acceptance_rate": self.num_accepted / self.num_drafted if self.num_drafted else 0.0,
            "num_drafted": self.num_drafted,
            "num_accepted": self.num_accepted,
            "per_position_acceptance": [a / p if p else None for a, p in zip(self.accepted_at, self.proposed_at)],
            "accepted_length_histogram": self.histogram,
            "no_draft_steps": self.num_steps - self.drafted_steps,
            "policy_info": dict(self.policy_info),
        }


class PhaseTimer:
    """Wall time per phase of a step: `with timer("draft"): ...`; `totals` maps phase -> seconds."""

    def __init__(self, *phases: str) -> None:
        self.totals = {phase: 0.0 for phase in phases}

    @contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        yield
        self.totals[phase] += time.perf_counter() - start


def timing_stats(num_prompt: int, num_generated: int, prefill_seconds: float, total_seconds: float) -> dict:
    """Throughput figures of one generation (prefill included in `total_seconds`)."""
    decode_seconds = total_seconds - prefill_seconds
    return {
        "num_prompt_tokens": num_prompt,
        "num_generated_tokens": num_generated,
        "prefill_seconds": prefill_seconds,
        "total_seconds": total_seconds,
        "prefill_tokens_per_second": num_prompt / prefill_seconds if prefill_seconds > 0 else float("inf"),
        # end to end: generated tokens over prefill + decode time
        "tokens_per_second": num_generated / total_seconds if total_seconds > 0 else float("inf"),
        # after the prefill: the tokens after the first (which the prefill itself yields)
        "decode_tokens_per_second": (num_generated - 1) / decode_seconds if decode_seconds > 0 else float("inf"),
    }


def run_stats(num_prompt: int, num_generated: int, prefill_seconds: float, total_seconds: float, finish_reason: str,
              steps: StepStats | None = None, timer: PhaseTimer | None = None, **named) -> dict:
    """The stats of one generation, built the same way by every loop (chain, tree, a batch's row):

        timing_stats    throughput, prefill included
        steps.summary   tau, acceptance, ... (None: plain decoding, tau = 1)
        timer.totals    `<phase>_seconds` for each phase of a step (draft, verify, policy)
        named           what else names the run (drafter, policy, gamma, forwards, ...)
        finish_reason   "eos" | "length" | "stop"
    """
    stats = timing_stats(num_prompt, num_generated, prefill_seconds, total_seconds)
    stats.update(steps.summary() if steps is not None else {"tau": 1.0})
    if timer is not None:
        stats.update({f"{phase}_seconds": seconds for phase, seconds in timer.totals.items()})
    stats.update(named, finish_reason=finish_reason)
    return stats
