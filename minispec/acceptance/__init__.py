"""Acceptance policies: how much of a draft to keep, and which token follows it.

    name            lossless?      rule (d_i the draft token, p the target's distribution, q the draft's)
    --------------  -------------  --------------------------------------------------------------------
    exact           yes (greedy)   accept d_i iff d_i == argmax p; correction / bonus: argmax
    sampling        yes (any T)    accept d_i with prob. min(1, p(d_i)/q(d_i)); correct from norm(max(0, p-q))
    block           yes (any T)    the draft judged as one block, from the last position back (Sun et al.):
                                   never fewer accepted tokens in expectation than `sampling`
    traversal       yes (any T)    block verification's tree form (Weng et al.): leaf to root, whole sequences
                                   first; on a chain, block itself
    multipath       yes (any T)    greedy multi-path block verification (after Thomas & Pal): block verification
                                   path by path on a tree, the residual passed on; on a chain, block itself
    typical         no             accept d_i iff p(d_i) > min(eps, delta * exp(-H(p)))   (Medusa)
    lenience        no             sampling against beta q: accept d_i with prob. min(1, p/(beta q)); correct from
                                   norm(max(0, p - beta q)) (Leviathan et al.); beta = 1 is sampling
    fly             no             the base (exact / sampling), plus a rejected d_i accepted where the target's
                                   top-k entropy >= theta and the next W drafts pass the base (FLy)
    ensemble        no             sampling against v = (1 - w) q + w p (DIVERSED's static ensemble): the output
                                   follows v exactly; w = 1 is sampling
    kl-judge        no             the base (exact / sampling), plus a rejected d_i kept where KL(target || draft)
                                   < threshold and the target's top probability <= confidence (judge decoding)
    dropmatch       no             K dropout paths through the LM head: JS radius test, else majority vote,
                                   OR-ed with the base (exact at T = 0, sampling at T > 0); Algorithm 1 as written
    dropmatch-lazy  no             dropmatch's decisions, by exact shortcuts: paths only where a verdict is
                                   needed, votes from row maxima, the JS radius through a TV bound

The interface (VerifyInput -> Decision), the input check and the registry are in base.py; each
policy has its own file. `get("dropmatch", p=0.3, paths=5)` builds one by name; `register`
adds your own.
"""

from minispec.acceptance.base import (AcceptancePolicy, Decision, PolicyInputError, VerifyInput, available,
                                      check_input, first_rejection, get, register)
from minispec.acceptance.block import BlockVerification, TraversalVerification
from minispec.acceptance.dropmatch.rule import DropMatch
from minispec.acceptance.dropmatch.lazy import LazyDropMatch
from minispec.acceptance.ensemble import StaticEnsemble
from minispec.acceptance.exact import ExactMatch
from minispec.acceptance.fly import FLy
from minispec.acceptance.kl_judge import KLJudge
from minispec.acceptance.lenience import Lenience
from minispec.acceptance.multipath import MultiPathBlockVerification
from minispec.acceptance.sampling import SpeculativeSampling
from minispec.acceptance.typical import TypicalAcceptance

BUILT_IN = tuple(available())  # minispec's own policies; a user's join the registry, not this list

__all__ = [
    "BUILT_IN",
    "AcceptancePolicy", "VerifyInput", "Decision", "PolicyInputError", "register", "get", "available",
    "check_input", "first_rejection",
    "ExactMatch", "SpeculativeSampling", "BlockVerification", "TraversalVerification", "MultiPathBlockVerification",
    "TypicalAcceptance",
    "Lenience", "FLy", "StaticEnsemble", "KLJudge", "DropMatch", "LazyDropMatch",
]
