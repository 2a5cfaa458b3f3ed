"""The error a queued receipt keeps when its handlers answer a final 4xx, and how the CLI and
the console read the status back from it (receiver/_queue/receipts.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from receiver import State
from receiver._queue.receipts import rejected_status, rejection


@given(status=st.integers(400, 499))
def test_the_status_a_handler_answered_is_read_back_from_its_error(status: int) -> None:
    assert rejected_status(State.FAILED, rejection(status)) == status
    assert rejected_status("failed", rejection(status)) == status  # a row's state, as text
    for state in (State.COMPLETED, State.QUEUED, State.RELEASED, State.IN_FLIGHT):
        assert rejected_status(state, rejection(status)) is None  # only a failed receipt


@given(error=st.text())
def test_no_other_error_reads_as_a_rejection(error: str) -> None:
    # Dead letters keep their exception as "ClassName: message": none reads as a rejection.
    if not error.startswith("HandlerRejected: the handler answered "):
        assert rejected_status(State.FAILED, error) is None
    assert rejected_status(State.FAILED, None) is None
    assert rejected_status(State.FAILED, "RuntimeError: downstream refused") is None
