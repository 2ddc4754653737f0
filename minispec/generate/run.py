"""Running the command line: load the checkpoint (and draft, policy, kernels), then decode one
prompt (minispec.decode.generate: a chain, plain decoding or a tree) or the lines of a prompt file
(--batch-size: minispec.batch.speculative.generate_batch), and return the --json object.

A run keeps its progress (the tokens so far) so that Ctrl-C can still report the text: the
streamed text is ended, or the --json object printed with finish_reason "interrupted".
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from minispec.cli import in_flags
from minispec.errors import MinispecError
from minispec.generate.flags import DTYPES, NOT_A_DRAFT_MODEL, GenerateArgs, check_flags
from minispec.generate.policy_spec import DROPMATCH_POLICIES
from minispec.generate.prompts import encode, prompt_lines, read_prompt
from minispec.generate.printing import Printer, StopStrings, decoded_text, print_prompt_text, use_colour

if TYPE_CHECKING:
    import torch


@dataclass
class Progress:
    """How far a one-prompt run got: what an interrupted run reports."""

    tokenizer: object = None
    prompt_ids: list[int] | None = None
    tokens: list[int] = field(default_factory=list)  # emitted so far (the loop's on_tokens)
    printer: Printer | None = None
    stop: StopStrings | None = None

    def on_tokens(self, tokens: list[int], num_accepted: int, num_proposed: int) -> None:
        self.tokens.extend(tokens)
        if self.printer is not None:
            self.printer.push(tokens, num_accepted, num_proposed)

    def text(self) -> str:
        return decoded_text(self.tokenizer, self.tokens, self.stop)

    def interrupted(self, as_json: bool) -> None:
        """Ctrl-C: print the --json object so far (finish_reason "interrupted"), or end the streamed text."""
        if as_json:
            print(json.dumps({"text": self.text(), "tokens": self.tokens,
                              "prompt_tokens": None if self.prompt_ids is None else len(self.prompt_ids),
                              "finish_reason": "interrupted", "stats": None}))
        elif self.printer is not None:
            self.printer.finish()


def run(args: GenerateArgs) -> dict:
    """Load, generate, return the --json object. On Ctrl-C: end the streamed text (or print the
    --json object so far, finish_reason "interrupted") and let the KeyboardInterrupt go on to
    run_main, which says so in one line and exits 130."""
    progress = Progress() if args.batch_size is None else BatchProgress()
    try:
        check_flags(args)
        model, tokenizer, drafter, ckpt = load(args)
        progress.tokenizer = tokenizer
        if args.batch_size is None:
            return run_one(args, progress, model, tokenizer, drafter, ckpt)
        return run_batch(args, progress, model, tokenizer, drafter, ckpt)
    except KeyboardInterrupt:
        progress.interrupted(args.json)
        raise


def run_one(args: GenerateArgs, progress: Progress, model, tokenizer, drafter, ckpt: Path) -> dict:
    """One prompt: streamed as it is decoded (or traced step by step, or kept for --json)."""
    from minispec.decode import generate

    prompt_ids = progress.prompt_ids = read_prompt(args, tokenizer)
    policy = _policy(args, model, prompt_ids, tokenizer)  # before the kernels: p=auto calibrates the reference
    ran = _apply_kernels(args, model, drafter, ckpt)
    stop = progress.stop = StopStrings(tokenizer, args.stop) if args.stop else None
    printer = progress.printer = None if args.json or args.trace else Printer(
        tokenizer, colour=args.show and use_colour(args.color), stops=args.stop)
    options = {}
    if drafter is not None:
        options.update(draft=drafter, policy=policy, gamma=args.gamma)
        if args.tree is None:
            options.update(draft_length=_draft_length(args, model, drafter))
        else:  # the chain drafter's tree form (built by the tree chapter, on the model the kernels rewrote)
            from minispec.trees.drafters import TreeSpec

            options.update(tree=TreeSpec(budget=args.tree, branching=args.branching,
                                         width=args.tree_width))
    if args.trace:
        from minispec.generate.trace import Tracer

        options.update(on_step=Tracer(tokenizer, drafter.name, policy.name,
                                      out=sys.stderr if args.json else None))  # keep JSON clean
    result = generate(model, prompt_ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                      top_k=args.top_k, top_p=args.top_p, seed=args.seed, eos_token_ids=tokenizer.eos_token_ids,
                      on_tokens=progress.on_tokens, stop_when=stop, **options)
    text = decoded_text(tokenizer, result.tokens, stop)
    if printer is not None:
        printer.finish()
    elif args.trace and not args.json:
        print(text)
    if args.policy in DROPMATCH_POLICIES:  # p as it ran (calibrated for p=auto)
        result.stats["dropout_p"] = policy.p
    result.stats.update(ran)
    if hasattr(options.get("draft_length"), "costs"):  # auto: the prices it chose by
        result.stats["draft_costs"] = options["draft_length"].costs
    if args.vs_plain:  # the same prompt and settings without the draft, timed the same way, after it
        plain = generate(model, prompt_ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                         top_k=args.top_k, top_p=args.top_p, seed=args.seed, eos_token_ids=tokenizer.eos_token_ids,
                         stop_when=stop)
        plain_speed = plain.stats["tokens_per_second"]
        result.stats.update(plain_tokens_per_second=plain_speed, plain_tokens_equal=plain.tokens == result.tokens,
                            speedup=result.stats["tokens_per_second"] / plain_speed, policy_lossless=policy.lossless)
    return {"text": text, "tokens": result.tokens, "prompt_tokens": len(prompt_ids),
            "finish_reason": result.finish_reason, "stats": result.stats}


def load(args: GenerateArgs):
    """The target model, its tokenizer, the drafter (None: plain decoding) and the checkpoint folder."""
    import torch

    from minispec import kernels
    from minispec.checkpoints.load import load_model
    from minispec.checkpoints.hub import resolve_checkpoint
    from minispec.checkpoints.tokenizer import load_tokenizer

    device = _device(args.device)
    if args.ckpt is None:
        if args.revision is not None:
            raise MinispecError("--revision: a hub revision of --ckpt; expected a --ckpt repo id with it")
        from minispec.checkpoints.fetch import ensure_default_checkpoint

        ckpt = ensure_default_checkpoint()
    else:
        ckpt = resolve_checkpoint(args.ckpt, args.revision, what="--ckpt")

    if DTYPES[args.dtype] != "auto":
        dtype = getattr(torch, DTYPES[args.dtype])
    elif args.kernels == "auto":  # the weights too: nf4 (loaded in float32) where it runs and pays
        from minispec.model.config import ModelConfig

        dtype = kernels.auto_weights(ModelConfig.from_hf(ckpt), device)[0]
    else:
        dtype = kernels.auto_dtype(device)
    model = load_model(ckpt, dtype=dtype, device=device)
    tokenizer = load_tokenizer(ckpt)
    check_tokenizer_fits(tokenizer, model, ckpt)
    drafter = _drafter(args, model, tokenizer)  # before the kernels: a self-draft copies the loaded weights
    return model, tokenizer, drafter, ckpt


def _draft_length(args: GenerateArgs, model, drafter):
    """--draft-length: fixed or heuristic by name; fallback:TAU and auto are the lab's schedules, auto
    priced by this machine's measured step costs (after the kernels are applied: the prices are those
    of the kinds that run)."""
    from minispec.lab.draft_length import Fallback, Priced

    if args.draft_length.startswith("fallback:"):
        return Fallback(args.gamma, float(args.draft_length.partition(":")[2]))
    if args.draft_length != "auto":
        return args.draft_length
    from minispec.lab import step_cost

    return Priced(args.gamma, step_cost.costs(model, drafter, args.gamma))


def _apply_kernels(args: GenerateArgs, model, drafter, ckpt: Path) -> dict:
    """--kernels and --draft-kernels: rewrite the loaded model (and a draft model) in place; the
    kinds that run, for the stats ({"kernels": ..., "draft_kernels": ...})."""
    from minispec import kernels

    auto = args.kernels == "auto"  # kernels.auto_kind: the fastest kind that keeps the weights
    kind = args.kernels
    if auto and DTYPES[args.dtype] == "auto":  # --dtype auto chose the weights: nf4, or "auto" for auto_kind
        kind = kernels.auto_weights(model.config, model.device)[1]
    kind = kernels.auto_kind(model) if kind == "auto" else kind
    kernels.apply(model, kind, checkpoint=ckpt)
    draft_model = None if drafter is None else drafter.model
    separate = draft_model is not None and draft_model is not model and \
        args.draft.partition(":")[0] not in NOT_A_DRAFT_MODEL  # a draft model with weights of its own
    draft_kind = args.draft_kernels
    if draft_kind == "auto" and separate:  # the fastest step this CPU runs, measured: any precision drafts
        draft_kind = kernels.auto_draft_kind(draft_model, kind)
    elif draft_kind in ("auto", "same"):
        draft_kind = kernels.auto_kind(draft_model) if auto and draft_model is not None else \
            {"compiled": "fast", "nf4-compiled": "nf4"}.get(kind, kind)  # a draft model is compiled only when asked
    try:
        kernels.apply_drafter(drafter, draft_kind)
    except MinispecError as err:  # the draft's kind is --draft-kernels, not --kernels
        raise MinispecError(in_flags(str(err), {"kind": "--draft-kernels"}).replace("the model", "the draft model")
                            ) from None
    compiled = {id(m): (m, rows) for m, rows in ((draft_model, kernels.compiled.DRAFT_ROWS),
                                                 (model, (args.gamma + 1,) if drafter else ()))
                if isinstance(m, kernels.compiled.CompiledTransformer)}  # a draft model, the target: each once
    if compiled and not args.json:
        print("compiling the decoding steps (minutes on first use; cached on disk) ...", file=sys.stderr)
    for m, verify_rows in compiled.values():
        kernels.compiled.warm_up(m, verify_rows=verify_rows)
    ran = {"kernels": kernels.kind_of(model),
           "dtype": str(model.weights_dtype if hasattr(model, "weights_dtype") else model.dtype)}
    if draft_model is not None and draft_model is not model:
        ran["draft_kernels"] = kernels.kind_of(draft_model)
    return ran


# ---------------------------------------------------------------- several prompts (--batch-size)


@dataclass
class BatchProgress:
    """How far a batch got: each prompt's tokens so far, and its finish reason once its row has
    finished (the batch's on_finish). Prints prompt i's text, under its header, once prompt i and
    every prompt before it have finished (a header names the finish reason, so a text is printed
    whole); what an interrupted batch reports."""

    tokenizer: object = None
    prompts: list[list[int]] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)  # per prompt, emitted so far
    reasons: list[str | None] = field(default_factory=list)  # per prompt, once finished
    printed: int = 0  # prompts printed so far (text mode)
    stop: StopStrings | None = None
    print_text: bool = True

    def start(self, prompts: list[list[int]]) -> None:
        self.prompts, self.tokens, self.reasons = prompts, [[] for _ in prompts], [None] * len(prompts)

    def on_tokens(self, index: int, tokens: list[int], num_accepted: int, num_proposed: int) -> None:
        self.tokens[index].extend(tokens)

    def on_finish(self, index: int, result) -> None:
        """Prompt `index` is done: print it, and every finished prompt after it, in order."""
        self.reasons[index] = result.finish_reason
        while self.print_text and self.printed < len(self.prompts) and self.reasons[self.printed] is not None:
            print_prompt_text(self.printed, len(self.prompts), self.reasons[self.printed], self.text(self.printed))
            self.printed += 1

    def text(self, index: int) -> str:
        return decoded_text(self.tokenizer, self.tokens[index], self.stop)

    def interrupted(self, as_json: bool) -> None:
        """Ctrl-C: the printed texts stay; --json prints the object so far, "interrupted" where unfinished."""
        if as_json:
            results = [{"text": self.text(i), "tokens": self.tokens[i], "prompt_tokens": len(prompt),
                        "finish_reason": self.reasons[i] or "interrupted", "stats": None}
                       for i, prompt in enumerate(self.prompts)]
            print(json.dumps({"results": results, "stats": None}))


def run_batch(args: GenerateArgs, progress: BatchProgress, model, tokenizer, drafter, ckpt: Path) -> dict:
    """--batch-size N: every line of --prompt-file a prompt, N decoded together (minispec.batch.speculative)."""
    from minispec.batch.speculative import generate_batch

    lines = prompt_lines(args)
    prompts = [encode(args, tokenizer, text, f"--prompt-file {args.prompt_file} line {number}")
               for number, text in lines]
    seeds = [args.seed + i for i in range(len(prompts))]  # prompt i: what it gives alone with --seed + i
    if seeds[-1] >= 2**64:
        first = 2**64 - args.seed + 1  # counted from 1, as the headers count: prompt i uses --seed + i - 1
        raise MinispecError(f"--seed {args.seed}: prompt i (from 1) uses --seed + i - 1, which passes 2**64 - 1 at "
                            f"prompt {first}; expected --seed <= {2**64 - len(prompts)} for {len(prompts)} prompts")
    progress.start(prompts)
    ran = _apply_kernels(args, model, drafter, ckpt)
    policy = _policy(args)  # p=auto is refused with --batch-size
    stop = progress.stop = StopStrings(tokenizer, args.stop) if args.stop else None
    progress.print_text = not args.json
    speculative = {} if drafter is None else {"draft_length": args.draft_length}
    try:
        batch = generate_batch(
            model, prompts, max_new_tokens=args.max_new_tokens, draft=drafter, policy=policy, gamma=args.gamma,
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=seeds,
            eos_token_ids=tokenizer.eos_token_ids, on_tokens=progress.on_tokens, on_finish=progress.on_finish,
            stop_when=stop, batch_size=args.batch_size, **speculative,
        )
    except MinispecError as err:  # about one prompt (too long for the context): name the file's line
        if err.prompt_index is None:
            raise
        raise type(err)(f"--prompt-file {args.prompt_file} line {lines[err.prompt_index][0]}: {err.reason}") from None
    stats = dict(batch.stats) | ran  # pooled; names the drafter, policy and gamma when there is a draft
    results = []
    for i, result in enumerate(batch):
        if args.policy in DROPMATCH_POLICIES:
            result.stats["dropout_p"] = policy.p
        results.append({"text": decoded_text(tokenizer, result.tokens, stop), "tokens": result.tokens,
                        "prompt_tokens": len(prompts[i]), "finish_reason": result.finish_reason,
                        "stats": result.stats})
    if args.policy in DROPMATCH_POLICIES:
        stats["dropout_p"] = policy.p
    return {"results": results, "stats": stats}


SMALLEST_TOKENIZER_SHARE = 0.9  # of the embedding's rows: padding adds a few percent at most (Qwen2: 0.2%)


def check_tokenizer_fits(tokenizer, model, ckpt) -> None:
    """Every id the tokenizer can give must be a row of the model's embedding, and the tokenizer must
    cover most rows: a model may have more rows than tokens (vocabularies are padded, e.g. Qwen2's
    151936 rows for 151665 tokens), but a tokenizer with under 90% of the rows is another model's."""
    tokens, rows = tokenizer.vocab_size, model.config.vocab_size
    if tokens > rows:
        raise MinispecError(f"--ckpt {ckpt}: tokenizer.json has {tokens} tokens but config.json's "
                            f"vocab_size is {rows}, so some token ids have no embedding row; "
                            "expected the tokenizer the model was trained with")
    if tokens < SMALLEST_TOKENIZER_SHARE * rows:
        raise MinispecError(f"--ckpt {ckpt}: tokenizer.json has {tokens} tokens for config.json's vocab_size {rows} "
                            f"({tokens / rows:.1%} of the embedding's rows): another model's tokenizer; expected the "
                            "tokenizer the model was trained with (padding adds a few percent of rows at most)")


def _device(name: str) -> torch.device:
    """--device as a torch.device that can run a model here (minispec.checkpoints.load.usable_device)."""
    from minispec.checkpoints.load import usable_device

    return usable_device(name, "--device")


def _drafter(args: GenerateArgs, model, tokenizer):
    """--draft as a Drafter; a draft checkpoint (folder or repo id) must share the target's tokenizer."""
    from minispec.chain.drafters import make_drafter

    from minispec.checkpoints.hub import is_repo_id, resolve_checkpoint
    from minispec.checkpoints.known import is_known

    spec = args.draft
    if spec is not None and (Path(spec).exists() or is_known(spec) or is_repo_id(spec.partition("@")[0])):  # a model
        from minispec.checkpoints.tokenizer import check_same_vocabulary, load_tokenizer

        folder = resolve_checkpoint(spec, what="--draft")
        check_same_vocabulary(load_tokenizer(folder), tokenizer, draft_name=f"--draft {spec}",
                              target_name="the target")
        spec = str(folder)
    drafter = make_drafter(spec, model, p_min=args.draft_p_min)
    if args.draft_vocab is not None:  # before the kernels: they put the kept rows in their own layer
        from minispec.kernels import frequent_head

        frequent_head.apply(drafter.model, args.draft_vocab, tokenizer.added_token_ids)
    return drafter


def _policy(args: GenerateArgs, model=None, prompt_ids: list[int] | None = None, tokenizer=None):
    """The policy named by --policy with its options; DropMatch's p=auto[:LEVEL] calibrated on this
    prompt first (minispec.lab.dropout_calibration: on the target's own plain continuation)."""
    from minispec import acceptance

    options = dict(args.policy_options)
    auto = options.pop("p") if isinstance(options.get("p"), tuple) else None
    try:
        policy = acceptance.get(args.policy, **options)  # the options checked before any calibration
        if auto is not None:
            options["p"] = calibrated_p(args, model, prompt_ids, tokenizer, policy.paths, level=auto[1])
            policy = acceptance.get(args.policy, **options)
    except MinispecError as err:
        raise MinispecError(f"--policy {args.policy}: {err}") from None
    return policy


def calibrated_p(args: GenerateArgs, model, prompt_ids: list[int], tokenizer, paths: int, level: float) -> float:
    """p=auto: the dropout rate whose K heads all keep the clean argmax at `level` of the positions of
    the target's own first CALIBRATION_TOKENS greedy tokens after this prompt."""
    from minispec.chain.request import check_prompt
    from minispec.chain.speculative import generate_chain
    from minispec.lab.dropout_calibration import CALIBRATION_TOKENS, auto_dropout_p

    check_prompt(model, prompt_ids, args.max_new_tokens)  # the user's request first: its error names their flag
    room = model.config.max_position_embeddings - len(prompt_ids)  # >= --max-new-tokens >= 1
    continuation = generate_chain(model, prompt_ids, max_new_tokens=min(CALIBRATION_TOKENS, room),
                                  eos_token_ids=tokenizer.eos_token_ids).tokens  # the target's own, plainly
    return auto_dropout_p(model, prompt_ids, paths, level, continuation=continuation)
