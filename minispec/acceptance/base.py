"""The acceptance-policy interface, its input check, and the registry by name.

After the target has scored the draft, a policy decides how much of it to keep:

    inputs   draft_tokens [gamma]         d_1..d_gamma, proposed by the drafter
             q_draft      [gamma, V]      the draft's distribution at each drafted position
             target_logits[gamma+1, V]    the target's logits after [last, d_1..d_gamma]
             p_target     [gamma+1, V]    the same, post-processed (temperature, top-k, top-p)
    decision num_accepted in 0..gamma     the accepted prefix d_1..d_num_accepted
             next_token                   the correction at position num_accepted+1 if a draft
                                          was rejected, else the bonus token after d_gamma

Row i of the target (0-based) is the target's prediction for the position of d_{i+1}; the last
row, gamma, predicts the token after the whole draft (the bonus). A policy never touches a KV
cache: the loop in minispec.chain.speculative owns both caches and rolls them back.

q_draft and p_target went through the same `minispec.model.sampling.logits_to_probs`, so temperature,
top-k and top-p are applied identically to both before any policy sees them. A drafter without
probabilities (n-gram lookup) gives a one-hot q_draft.

A policy that re-runs the LM head (DropMatch, on dropped-out copies of its input) finds the
head's input `hidden` [gamma+1, d] and the `head` itself in the VerifyInput, and calls the head
itself for whatever rows it needs.

To plug in your own policy: subclass AcceptancePolicy, implement `decide`, and decorate it with
`@register("my-name")`; `minispec.acceptance.get("my-name", **kwargs)` then builds it, and the
CLI's --policy accepts the name.
"""

from __future__ import annotations

import inspect
import numbers
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch

from minispec.errors import MinispecError
from minispec.model.sampling import SamplingParams


class PolicyInputError(ValueError):
    """The loop (or a test) handed a policy inconsistent tensors: a bug, not a user mistake."""


@dataclass
class VerifyInput:
    draft_tokens: torch.Tensor  # [gamma] int64, gamma >= 0
    q_draft: torch.Tensor  # [gamma, V] post-processed draft distributions (one-hot if the drafter has none)
    target_logits: torch.Tensor  # [gamma+1, V] raw target logits
    p_target: torch.Tensor  # [gamma+1, V] post-processed target distributions
    params: SamplingParams  # temperature / top-k / top-p used for both p_target and q_draft
    generator: torch.Generator  # the only source of randomness for the decision
    draft_logits: torch.Tensor | None = None  # [gamma, V] raw draft logits; None for model-free drafters
    # For policies that re-run the LM head on perturbed inputs (DropMatch); the loop always fills them.
    hidden: torch.Tensor | None = None  # [gamma+1, d] the LM-head input (after the final norm)
    head: Callable[[torch.Tensor], torch.Tensor] | None = None  # the target's LM head: [..., d] -> [..., V]

    @property
    def gamma(self) -> int:
        return self.draft_tokens.shape[0]


@dataclass
class Decision:
    num_accepted: int  # length of the accepted draft prefix, 0..gamma
    next_token: int  # correction (num_accepted < gamma) or bonus (num_accepted == gamma)
    info: dict = field(default_factory=dict)  # optional diagnostics (e.g. DropMatch head agreement)


class AcceptancePolicy(ABC):
    """Base class: validates the inputs, then delegates to `decide`."""

    name: ClassVar[str] = "?"
    lossless: ClassVar[bool] = False  # True if the output distribution provably equals p_target's

    def reset(self, seed: int | None = None, gamma: int | None = None) -> None:
        """Called at the start of every generation with the run's seed and the most drafts a step
        of it can hold (both None outside a run).

        A policy with randomness of its own (DropMatch's masks) reseeds its generator here, from
        the seed, so that `generate(seed=s)` fixes every draw of the run; a policy that cannot
        honour a run's gamma (FLy's window must fit inside the draft) refuses it here, in one
        line. The verify generator, inp.generator, is the loop's and is seeded by the loop.
        """

    def __call__(self, inp: VerifyInput) -> Decision:
        check_input(inp)
        decision = self.decide(inp)
        if not isinstance(decision, Decision):
            raise PolicyInputError(f"{self.name}: decide returned {type(decision).__name__}; expected a Decision")
        try:  # what a plug-in returns, checked by the one rule every plug-in boundary uses
            decision.num_accepted = returned_index(decision.num_accepted, f"{self.name}: Decision.num_accepted",
                                                   inp.gamma + 1)
            decision.next_token = returned_index(decision.next_token, f"{self.name}: Decision.next_token",
                                                 inp.target_logits.shape[1])
        except MinispecError as err:
            raise PolicyInputError(str(err)) from None
        return decision

    @abstractmethod
    def decide(self, inp: VerifyInput) -> Decision:
        """How many drafts to accept, and the token that follows them."""

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


def check_input(inp: VerifyInput) -> None:
    """Strict shape and range checks, so a policy can index without guarding."""
    if inp.draft_tokens.dim() != 1 or inp.draft_tokens.dtype != torch.int64:
        raise PolicyInputError(f"draft_tokens: shape {list(inp.draft_tokens.shape)} {inp.draft_tokens.dtype}; expected [gamma] int64")
    gamma = inp.gamma
    if inp.target_logits.dim() != 2 or inp.target_logits.shape[0] != gamma + 1:
        raise PolicyInputError(f"target_logits: shape {list(inp.target_logits.shape)}; expected [gamma+1={gamma + 1}, V]")
    vocab = inp.target_logits.shape[1]
    expected = {"p_target": (gamma + 1, vocab), "q_draft": (gamma, vocab)}
    if inp.draft_logits is not None:
        expected["draft_logits"] = (gamma, vocab)
    for name, shape in expected.items():
        got = tuple(getattr(inp, name).shape)
        if got != shape:
            raise PolicyInputError(f"{name}: shape {list(got)}; expected {list(shape)} (gamma={gamma}, V={vocab})")
    if inp.hidden is not None and (inp.hidden.dim() != 2 or inp.hidden.shape[0] != gamma + 1):
        raise PolicyInputError(f"hidden: shape {list(inp.hidden.shape)}; expected [gamma+1={gamma + 1}, d]")
    if gamma and not (0 <= int(inp.draft_tokens.min()) and int(inp.draft_tokens.max()) < vocab):
        raise PolicyInputError(f"draft_tokens: ids outside [0, {vocab}): {inp.draft_tokens.tolist()}")


def returned_index(value, where: str, upper: int | None = None) -> int:
    """A count or token id that user code returned (a policy's Decision, a conformance engine's
    step), as a Python int in [0, upper): an int (numpy's too) or a one-element integer tensor. A
    float is not truncated, a string not parsed, a bool not read as 0/1 and a 0-d tensor not kept
    as a tensor (it would compare unequal to every eos id): each is a MinispecError naming `where`."""
    if isinstance(value, torch.Tensor):
        if value.numel() == 1 and not value.is_floating_point() and not value.is_complex() and value.dtype != torch.bool:
            value = int(value)
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):  # numpy's ints are Integral
        raise MinispecError(f"{where} = {value!r} ({type(value).__name__}); expected an int")
    if value < 0 or (upper is not None and value >= upper):
        raise MinispecError(f"{where} = {value}; expected 0 <= {where.rsplit('.', 1)[-1]} < {upper}" if upper is not None
                            else f"{where} = {value}; expected an int >= 0")
    return int(value)


def is_number(value) -> bool:
    """A real number (int or float, not a bool): what a policy's numeric options must be."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def first_rejection(accepted: torch.Tensor) -> int:
    """Length of the all-True prefix of a [gamma] bool tensor: everything after the first
    rejected draft is discarded, whatever the policy thought of it (the prefix rule)."""
    rejected = (~accepted).nonzero()
    return int(rejected[0]) if len(rejected) else accepted.shape[0]


# ------------------------------------------------------------------------------------ registry

_REGISTRY: dict[str, type[AcceptancePolicy]] = {}


def register(name: str):
    """Class decorator: make a policy available as `get(name, **kwargs)` and `--policy name`."""

    def add(cls: type[AcceptancePolicy]) -> type[AcceptancePolicy]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"acceptance policy name {name!r} is already registered by {_REGISTRY[name].__name__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return add


def available() -> list[str]:
    return sorted(_REGISTRY)


def get(policy: str | AcceptancePolicy, **kwargs) -> AcceptancePolicy:
    """A policy object from a registered name (kwargs go to its constructor), or the object itself."""
    if isinstance(policy, AcceptancePolicy):
        if kwargs:
            raise MinispecError(f"policy: options {sorted(kwargs)} given with a policy object; pass them to its constructor")
        return policy
    if not isinstance(policy, str) or policy not in _REGISTRY:
        raise MinispecError(f"policy = {policy!r}: unknown acceptance policy; expected one of {available()}")
    cls = _REGISTRY[policy]
    options = constructor_options(policy)  # name -> the type it takes
    unknown = sorted(set(kwargs) - set(options))
    if unknown:
        expected = f"its options are {list(options)}" if options else "it takes no options"
        raise MinispecError(f"policy {policy!r}: unknown option(s) {unknown}; {expected}")
    kwargs = {key: check_option_type(policy, key, value, options[key]) for key, value in kwargs.items()}
    return cls(**kwargs)


def check_option_type(policy: str, key: str, value, kind: type | None):
    """`value` as the type the option takes, else a MinispecError: a bool for a bool option (not 'no'
    or 1), an int (not a bool) for an int, a real number for a float, a str for a str; numpy's
    scalars become the Python number they hold (np.float32(0.3) is the float 0.3 the user typed,
    not 0.30000001192092896). An option whose type neither default nor annotation says is left to
    the constructor. None passes where the default is None (the option is then optional)."""
    if kind is None or value is None:
        return value
    if kind is int and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if kind is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
        if isinstance(value, float):  # float and numpy.float64: exact
            return float(value)
        try:  # numpy.float32 and the like: the shortest decimal that reads back as it
            return float(str(value))
        except ValueError:
            return float(value)
    if kind is bool and isinstance(value, bool) or kind is str and isinstance(value, str):
        return value
    raise MinispecError(f"{policy} {key} = {value!r}; expected {'an' if kind is int else 'a'} {kind.__name__}")


def constructor_options(policy: str) -> dict[str, type | None]:
    """A registered policy's constructor options: name -> the type its value takes (bool, int, float or
    str: the default's type, else the annotation's), or None where neither says."""
    parameters = inspect.signature(_REGISTRY[policy]).parameters.values()
    return {param.name: option_type(param) for param in parameters
            if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)}


def option_type(param: inspect.Parameter) -> type | None:
    """bool, int, float or str from a parameter's default, else from its annotation (text or type)."""
    simple = (bool, int, float, str)
    if type(param.default) in simple:
        return type(param.default)
    annotation = param.annotation if isinstance(param.annotation, str) else getattr(param.annotation, "__name__", "")
    kinds = [kind for kind in simple if kind.__name__ in annotation.replace(" ", "").split("|")]
    return kinds[0] if len(kinds) == 1 else None
