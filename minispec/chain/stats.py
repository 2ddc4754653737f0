"""What the loop counts: tau, acceptance, where drafts fail, and where the time goes.

Per verify step the loop keeps how many tokens were drafted (g), how many of them the policy
accepted (n), how many tokens it committed and the policy's Decision.info; step_stats counts
them after the run. A step emits e tokens: normally e = n + 1 (the accepted drafts,
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

A policy may report its own counts in Decision.info, of two kinds, each summed over the steps
into `policy_info`:

    per-position flags   a [g] bool/int tensor or list (DropMatch: which drafts only it accepted):
                         counted over the step's COMMITTED drafts only, flags[:min(n, e)], so a
                         flag on a rejected draft, or on an accepted one cut off by an eos, counts nothing
    work counts          a number (DropMatch: head calls, positions judged): summed as reported
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Number


StepCount = tuple  # (drafted g, accepted n, committed e, the policy's Decision.info) of one verify step


def step_stats(steps: Sequence[StepCount], gamma: int) -> dict:
    """The figures above from the loop's per-step counts, steps[i] = (g, n, e, info).

    A step counts by what it committed: when an eos or stop fell inside its accepted run (e <= n),
    it counts as a draft of e tokens, all accepted, emitting e (what came after the end was never
    emitted, so it was neither accepted nor rejected); otherwise as g drafted, n accepted, n + 1
    emitted. gamma: the most any step drafted (the length of per_position_acceptance).
    """
    counted = [(e, e, e) if e <= n else (g, n, n + 1) for g, n, e, _ in steps]  # (drafted, accepted, emitted)
    drafted = [(g, n, e) for g, n, e in counted if g > 0]
    policy_info: dict[str, Number] = {}
    for (*_, info), (_, committed, _) in zip(steps, counted):
        for key, value in info_counts(info, committed).items():
            policy_info[key] = policy_info.get(key, 0) + value
    num_drafted, num_accepted = sum(g for g, _, _ in counted), sum(n for _, n, _ in counted)
    histogram = [0] * (gamma + 1)
    for _, n, _ in drafted:
        histogram[n] += 1
    proposed_at = [sum(g > i for g, _, _ in counted) for i in range(gamma)]
    accepted_at = [sum(n > i for _, n, _ in counted) for i in range(gamma)]
    return {
        "verify_steps": len(steps),
        # emitted per step = accepted drafts + 1 correction/bonus token (fewer only if the run ended inside it)
        "tau": sum(e for _, _, e in counted) / len(steps) if steps else 1.0,
        "drafted_steps": len(drafted),
        # the same over the steps that drafted something (vLLM's and llama.cpp's mean accepted length)
        "tau_drafted": sum(e for _, _, e in drafted) / len(drafted) if drafted else None,
        "acceptance_rate": num_accepted / num_drafted if num_drafted else 0.0,
        "num_drafted": num_drafted,
        "num_accepted": num_accepted,
        "per_position_acceptance": [a / p if p else None for a, p in zip(accepted_at, proposed_at)],
        "accepted_length_histogram": histogram,
        "no_draft_steps": len(steps) - len(drafted),
        "policy_info": policy_info,
    }


def info_counts(info: dict, committed: int) -> dict[str, Number]:
    """One step's Decision.info as counts: per-position flags (a tensor, list or tuple) summed over
    the first `committed` drafts, work counts (numbers) as they are; anything else left out."""
    counts = {}
    for key, value in info.items():
        if hasattr(value, "tolist") or isinstance(value, (list, tuple)):  # per-position flags
            flags = value.tolist() if hasattr(value, "tolist") else list(value)
            counts[key] = int(sum(flags[:committed]))
        elif isinstance(value, Number) and not isinstance(value, bool):  # a work count
            counts[key] = value
    return counts


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
              steps: Sequence[StepCount] | None = None, positions: int = 1, phase_seconds: dict | None = None,
              **named) -> dict:
    """The stats of one generation, built the same way by every loop (chain, tree, a batch's row):

        timing_stats    throughput, prefill included
        step_stats      tau, acceptance, ... from the per-step counts (None: plain decoding, tau = 1),
                        per_position_acceptance over `positions` positions
        phase_seconds   `<phase>_seconds` for each phase of a step (draft, verify, policy)
        named           what else names the run (drafter, policy, gamma, forwards, ...)
        finish_reason   "eos" | "length" | "stop"
    """
    stats = timing_stats(num_prompt, num_generated, prefill_seconds, total_seconds)
    stats.update(step_stats(steps, positions) if steps is not None else {"tau": 1.0})
    if phase_seconds is not None:
        stats.update({f"{phase}_seconds": seconds for phase, seconds in phase_seconds.items()})
    stats.update(named, finish_reason=finish_reason)
    return stats


class PooledStats:
    """A batch's own figures, over every group of a generate_batch call: its passes and wall time,
    and every row's steps pooled (tau = committed tokens over row-steps)."""

    def __init__(self, gamma: int) -> None:
        self.gamma = gamma  # the most a step drafts: per_position_acceptance's length
        self.steps: list[StepCount] = []  # every row's steps, pooled
        self.prefill_seconds = self.last_prefill_seconds = self.seconds = 0.0
        self.passes = self.row_passes = self.prefills = 0
        self.phases = {"draft": 0.0, "verify": 0.0, "policy": 0.0}
        self.draft_forwards = 0

    def add_prefill(self, seconds: float) -> None:
        self.prefill_seconds += seconds
        self.last_prefill_seconds = seconds
        self.prefills += 1

    def add_pass(self, num_rows: int) -> None:
        self.passes += 1
        self.row_passes += num_rows

    def add_seconds(self, seconds: float) -> None:
        self.seconds += seconds

    def add_phases(self, phase_seconds: dict, draft_forwards: int) -> None:
        for phase, seconds in phase_seconds.items():
            self.phases[phase] += seconds
        self.draft_forwards += draft_forwards

    def summary(self, batch_size: int, drafter, policy, gamma: int, results: list) -> dict:
        """The batch's stats dict; drafter and policy (None: plain decoding) name the run, results
        are the rows' GenerationResults."""
        generated = sum(len(r.tokens) for r in results)
        stats = {
            "num_prompts": len(results),
            "batch_size": min(batch_size, len(results)),  # the most decoded together (docs/metrics.md)
            "num_prompt_tokens": sum(r.stats["num_prompt_tokens"] for r in results),
            "num_generated_tokens": generated,
            "prefill_seconds": self.prefill_seconds,
            "total_seconds": self.seconds,
            # aggregate throughput: every row's tokens over the batch's wall time (prefill included)
            "tokens_per_second": generated / self.seconds if self.seconds > 0 else float("inf"),
            "target_forwards": self.prefills + self.passes,  # batched passes: a prefill per group, then one per step
            "mean_rows_per_pass": self.row_passes / self.passes if self.passes else 0.0,
        }
        if drafter is None:
            stats.update(tau=1.0)
            return stats
        stats.update(step_stats(self.steps, self.gamma))  # pooled over every row's steps: tau = committed / row-steps
        stats.update(draft_forwards=self.draft_forwards, drafter=drafter.name, policy=policy.name, gamma=gamma,
                     **{f"{phase}_seconds": seconds for phase, seconds in self.phases.items()})
        return stats
