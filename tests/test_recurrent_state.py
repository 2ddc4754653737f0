"""minispec.testing.recurrent_state: the rollback harness for recurrent state passes a right
checkpointing scheme and catches the 2026 bug class (a one-token step after a step that kept
several drafts reads the wrong slot), which a harness without zero-draft steps misses."""

from __future__ import annotations

import pytest

from minispec.errors import MinispecError
from minispec.testing.recurrent_state import CheckpointedState, RecurrentModel, check_recurrent_state


class DecodePathReadsTheFirstSlot(CheckpointedState):
    """The bug (vLLM #39273, #52942, #53505; SGLang PR #26351; TensorRT-LLM PR #13453, in their own
    forms): the decode path of a step with no drafts reads slot 0 of the last pass's states, the verify
    path the slot of the last kept token; they differ only after a pass that kept two or more."""

    def start(self, num_new):
        if num_new == 1 and self.kept:
            return self.states[0]
        return super().start(num_new)


def test_a_right_checkpointing_scheme_passes():
    check_recurrent_state()


def test_the_wrong_slot_after_several_kept_drafts_is_caught_by_a_zero_draft_step():
    with pytest.raises(AssertionError, match="differs from a pass over all of them"):
        check_recurrent_state(DecodePathReadsTheFirstSlot)


def test_without_zero_draft_steps_the_same_bug_goes_unseen():
    """Why the machine has the rule: verify passes alone never take the decode path."""
    check_recurrent_state(DecodePathReadsTheFirstSlot, zero_draft_steps=False)


def test_a_pass_in_pieces_equals_one_pass_and_rollback_reaches_the_last_pass_only():
    model = RecurrentModel(5, 3, seed=1)
    state = CheckpointedState(3, 10)
    whole = model([1, 2, 3, 4])
    assert (model([1, 2], state) - whole[:2]).abs().max() == 0
    assert (model([3, 4], state) - whole[2:]).abs().max() == 0
    state.truncate(3)
    assert state.length == 3 and (model([4], state) - whole[3:]).abs().max() == 0
    with pytest.raises(MinispecError, match=r"truncate\(1\); expected 3..4"):
        state.truncate(1)
    with pytest.raises(MinispecError, match="max_len 10"):
        model([0] * 7, state)


@pytest.mark.parametrize("factory, args, message", [
    (None, {}, r"cache_factory = None is not callable"),
    (lambda dim, max_len: 1 / 0, {}, r"cache_factory <lambda>\(2, 40\) raised ZeroDivisionError: division by zero"),
    (lambda dim, max_len: None, {}, r"returned a NoneType without start, record, truncate, length"),
    (lambda: CheckpointedState(1, 1), {}, r"raised TypeError"),
    (CheckpointedState, {"max_len": 4}, r"max_len = 4; expected an integer >= 5"),
    (CheckpointedState, {"max_len": True}, r"max_len = True"),
    (CheckpointedState, {"max_examples": 0}, r"max_examples = 0; expected None or an integer >= 1"),
])
def test_arguments_it_cannot_run_are_one_line(factory, args, message):
    with pytest.raises(MinispecError, match=r"^check_recurrent_state: " + ".*" + message):
        check_recurrent_state(factory, **args)
