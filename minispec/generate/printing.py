"""Printing: the streamed text (complete characters only, stop strings held back, colour by where
each token came from), a batch's texts in prompt order, and the stats lines after a run.
"""

from __future__ import annotations

import json
import os
import sys

from minispec.errors import MinispecError


def use_colour(when: str) -> bool:
    """--color: always, never, or auto = stdout is a terminal and NO_COLOR is not set (no-color.org)."""
    if when != "auto":
        return when == "always"
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def decoded_text(tokenizer, tokens: list[int], stop: "StopStrings | None" = None) -> str:
    """The text of `tokens` as it is printed: special tokens skipped, cut before the first stop string."""
    text = tokenizer.decode(tokens, skip_special_tokens=True) if tokens else ""
    return text if stop is None else stop.cut(text)


def print_prompt_text(index: int, num_prompts: int, reason: str, text: str) -> None:
    """One prompt of a batch, whole, under its header: `=== prompt i/n (finish reason) ===`."""
    print(f"=== prompt {index + 1}/{num_prompts} ({reason}) ===")
    print(text, flush=True)


class StopStrings:
    """The loop's stop_when for --stop: true once the decoded text contains any of the strings.

    The text is decoded as the output is (special tokens skipped); `cut` ends it before the first
    stop string, as vLLM and llama.cpp's server return it. Called after every token, it decodes
    only the last few tokens: a stop string that ends with the newest token spans at most 4 bytes
    (one byte-level BPE token at least) per character, and every earlier token was checked when it
    was newest.
    """

    def __init__(self, tokenizer, strings: tuple[str, ...]) -> None:
        for token_id in tokenizer.added_token_ids:  # special tokens are skipped in the text: never matched
            content = tokenizer.backend.id_to_token(token_id)
            hit = next((s for s in strings if content and content in s), None)
            if hit is not None and tokenizer.decode([token_id], skip_special_tokens=True) == "":
                raise MinispecError(f"--stop {hit!r}: holds the special token {content!r}, which the output text "
                                    "never contains (special tokens are skipped when it is decoded), so it could "
                                    "never stop the run; expected ordinary text (a run ends at eos by itself)")
        self.tokenizer, self.strings = tokenizer, strings
        self.window = 4 * max((len(s) for s in strings), default=0) + 1  # tokens decoded per check

    def __call__(self, tokens: list[int]) -> bool:
        text = self.tokenizer.decode(tokens[-self.window:], skip_special_tokens=True)
        return any(s in text for s in self.strings)

    def cut(self, text: str) -> str:
        return text[:min((text.find(s) for s in self.strings if s in text), default=len(text))]


GREEN, RED, BLUE, RESET = "\033[32m", "\033[31m", "\033[34m", "\033[0m"


class Printer:
    """Stream text to the terminal as tokens arrive (only complete UTF-8 characters).

    With colour: accepted draft tokens green; the token the target supplied after a rejection
    (the correction) red; the bonus token after a fully accepted draft blue; tokens of plain
    decoding steps uncoloured. With stop strings, text that could be the start of one is held
    back until it is known not to be, and nothing from the first stop string on is printed.
    """

    def __init__(self, tokenizer, colour: bool, stops: tuple[str, ...] = ()) -> None:
        self.stream, self.colour, self.stops = tokenizer.stream_decoder(skip_special_tokens=True), colour, stops
        self.pending: list[tuple[str, str]] = []  # (text, colour) held back
        self.stopped = False

    def push(self, tokens: list[int], num_accepted: int, num_proposed: int) -> None:
        drafted, last = tokens[:num_accepted], tokens[num_accepted:]
        self._emit(self.stream.push(drafted) if drafted else "", GREEN)
        if last:
            target_colour = "" if num_proposed == 0 else (BLUE if num_accepted == num_proposed else RED)
            self._emit(self.stream.push(last), target_colour)

    def _emit(self, text: str, colour: str) -> None:
        if self.stopped or not text:
            return
        self.pending.append((text, colour))
        joined = "".join(t for t, _ in self.pending)
        hits = [joined.find(s) for s in self.stops if s in joined]
        if hits:
            self.stopped = True
            self._release(min(hits))
        else:
            self._release(len(joined) - _held_back(joined, self.stops))

    def _release(self, num_chars: int) -> None:
        """Write the first num_chars held-back characters, each piece in its colour; keep the rest."""
        rest: list[tuple[str, str]] = []
        for text, colour in self.pending:
            head, tail = text[:num_chars], text[num_chars:]
            num_chars -= len(head)
            if head:
                sys.stdout.write(f"{colour}{head}{RESET}" if self.colour and colour else head)
            if tail:
                rest.append((tail, colour))
        self.pending = rest if not self.stopped else []
        sys.stdout.flush()

    def finish(self) -> None:
        if not self.stopped:
            self._emit(self.stream.flush(), "")
            self._release(sum(len(t) for t, _ in self.pending))
        sys.stdout.write("\n")
        sys.stdout.flush()


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that is the beginning of a stop string."""
    return max((k for s in stops for k in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:k])),
               default=0)


def report(args, out: dict) -> int:
    """After the run: the --json object, or a one-line summary on stderr (and --stats' lines)."""
    if args.json:
        print(json.dumps(out))
        return 0
    s = out["stats"]
    if args.batch_size is not None:
        print(f"[{s['num_prompts']} prompts, {s['num_generated_tokens']} tokens, {s['tokens_per_second']:.1f} tok/s "
              f"aggregate, prefill {s['num_prompt_tokens']} tokens in {s['prefill_seconds']:.2f}s]", file=sys.stderr)
    else:
        print(f"[{s['num_generated_tokens']} tokens, {s['tokens_per_second']:.1f} tok/s, "
              f"prefill {s['num_prompt_tokens']} tokens at {s['prefill_tokens_per_second']:.0f} tok/s]", file=sys.stderr)
    if args.stats:
        print(format_stats(s), file=sys.stderr)
    return 0


def kernels_line(s: dict) -> str:
    """'; kernels: target fast (torch.bfloat16), draft int8-dynamic': which path ran (empty if not said)."""
    if "kernels" not in s:
        return ""
    draft = f", draft {s['draft_kernels']}" if "draft_kernels" in s else ""
    return f"; kernels: target {s['kernels']} ({s.get('dtype', '?')}){draft}"


def draft_length_line(s: dict) -> str:
    """The schedule when it is not fixed (empty for fixed or a tree), e.g. ', draft length auto: 3.1
    drafted per drafted step, 2 steps without a draft (step cost of 0..gamma drafts, in plain steps:
    1.00, 1.10, ...)'."""
    name = s.get("draft_length", "fixed")
    if name == "fixed":
        return ""
    mean = f"{s['num_drafted'] / s['drafted_steps']:.1f}" if s.get("drafted_steps") else "-"
    costs = "" if "draft_costs" not in s else \
        " (step cost of 0..gamma drafts, in plain steps: " + ", ".join(f"{c:.2f}" for c in s["draft_costs"]) + ")"
    plain = s["no_draft_steps"]
    return f", draft length {name}: {mean} drafted per drafted step, {plain} step{'s' * (plain != 1)} without a " \
        "draft" + costs


def format_stats(s: dict) -> str:
    """A few readable lines of the loop's statistics (a batch's: pooled over its prompts, plus a line of its own)."""
    batch = "" if "num_prompts" not in s else (
        f"\nbatch: {s['num_prompts']} prompts, batch size {s['batch_size']}, aggregate {s['tokens_per_second']:.1f} "
        f"tok/s, {s['mean_rows_per_pass']:.2f} rows per batched pass (mean)")
    if "verify_steps" not in s:
        return f"plain decoding: {s['target_forwards']} target forwards" + kernels_line(s) + batch
    per_pos = " ".join("-" if a is None else f"{a:.2f}" for a in s["per_position_acceptance"])
    lines = [
        f"drafter {s['drafter']}, policy {s['policy']}, gamma {s['gamma']}" + draft_length_line(s),
        f"tau {s['tau']:.2f} tokens/step (incl. the correction/bonus token), acceptance rate {s['acceptance_rate']:.2f}",
        f"mean accepted length over the {s['drafted_steps']} steps with drafts (vLLM's, llama.cpp's): "
        + ("-" if s["tau_drafted"] is None else f"{s['tau_drafted']:.2f}"),
        f"per-position acceptance {per_pos}; accepted-length histogram {s['accepted_length_histogram']}",
        f"target forwards {s['target_forwards']}, draft forwards {s['draft_forwards']}" + kernels_line(s),
        f"time: draft {s['draft_seconds']:.2f}s, verify {s['verify_seconds']:.2f}s, policy {s['policy_seconds']:.2f}s, "
        f"total {s['total_seconds']:.2f}s",
    ]
    if s.get("tree"):
        lines.insert(1, f"tree: {s['nodes_per_step']:.1f} nodes verified per step (budget {s['budget']}, depth "
                        f"{s['max_depth']}); accepted depth per step {s['accepted_depth_histogram']}")
    info = s.get("policy_info", {})
    if "accepted_by_dropmatch_only" in info:
        agree = (f"all K heads agree with the clean argmax at {info['heads_agree'] / info['positions']:.1%} of positions"
                 if info.get("positions") else
                 f"dropout paths computed at {info.get('path_positions', 0) / s['verify_steps']:.2f} positions per step")
        lines.append(f"dropmatch p {s['dropout_p']:.4g}: {agree}; {info['accepted_by_dropmatch_only']} "
                     f"token{'' if info['accepted_by_dropmatch_only'] == 1 else 's'} accepted only thanks to DropMatch")
    if "speedup" in s:
        same = "the same tokens" if s["plain_tokens_equal"] else "other tokens: the policy is lossy" \
            if not s["policy_lossless"] else "other tokens (sampling, or a near-tie in rounding)"
        lines.append(f"vs plain decoding of this prompt: {s['plain_tokens_per_second']:.1f} tok/s plain, "
                     f"{s['tokens_per_second']:.1f} tok/s speculative: {s['speedup']:.2f}x ({same})")
    return "\n".join(lines) + batch
