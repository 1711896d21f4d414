"""The verdict, as a pure function of how a delivery ended, its attempt and its report."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from async_task_api_worker.conclusion import Failure, HandedOff, Response
from async_task_api_worker.engine.admission import Attempt, Refused
from async_task_api_worker.engine.decision import Reason
from async_task_api_worker.engine.verdict import (
    Ending,
    EngineFailed,
    GivenBack,
    Stopped,
    Swept,
    Verdict,
    decide,
    terminal_report,
    withdrawn,
)
from async_task_api_worker.ports import Action, Outcome
from async_task_api_worker.task_call import CANCELLED_BY_CLIENT

FIRST = Attempt(1, 5, count_known=True)
LAST = Attempt(5, 5, count_known=True)
OK = Response({"n": 1})
BAD = Failure("NOT_ALLOWED", "no")
AGAIN = Failure("BUSY", "later", retryable=True)
POISON = Refused("t-1", "c", Failure("INVALID_INPUT", "bad"), poison_reason="invalid_json")
NOBODY = Refused(None, None, None, poison_reason="no_task_id")
INVALID = Refused("t-1", "c", Failure("INVALID_INPUT", "bad"))
BY_CLIENT = Stopped(Outcome.CANCELLED_BY_CLIENT)
#: A process-isolated run whose lease lapsed (``engine.execution``): withdrawn, if the
#: transport withdrew the delivery meanwhile, else given back.
LAPSED = GivenBack(Outcome.CANCELLED, Reason.LEASE_LAPSED)

V = Verdict
NACK = Action.NACK_REQUEUE
HELD = Reason.HOLD_EXPIRED

# (ending, attempt, why its report did not get out) -> verdict
CASES: list[tuple[Ending, Attempt, Reason | None, Verdict]] = [
    (OK, FIRST, None, V(Outcome.SUCCESS, Action.ACK)),
    (OK, FIRST, HELD, V(Outcome.PUBLISH_FAILED, NACK, reason=HELD)),
    (OK, FIRST, Reason.ABORTED, V(Outcome.SHUTDOWN_REQUEUED, NACK, reason=Reason.ABORTED)),
    (OK, FIRST, Reason.WITHDRAWN, V(Outcome.PUBLISH_FAILED, NACK, reason=Reason.WITHDRAWN)),
    (BAD, FIRST, None, V(Outcome.FAILURE, Action.CONCLUDE, code="NOT_ALLOWED")),
    (BAD, FIRST, HELD, V(Outcome.PUBLISH_FAILED, NACK, code="NOT_ALLOWED", reason=HELD)),
    (AGAIN, FIRST, None, V(Outcome.RETRY, NACK, code="BUSY", counted=True)),
    (AGAIN, LAST, None, V(Outcome.FAILURE, Action.CONCLUDE, code="BUSY")),
    (AGAIN, LAST, HELD, V(Outcome.PUBLISH_FAILED, NACK, code="BUSY", reason=HELD)),
    (
        POISON,
        FIRST,
        None,
        V(Outcome.POISON, Action.CONCLUDE, "INVALID_INPUT", False, "invalid_json"),
    ),
    (
        POISON,
        FIRST,
        HELD,
        V(Outcome.PUBLISH_FAILED, NACK, "INVALID_INPUT", poison_reason="invalid_json", reason=HELD),
    ),
    (NOBODY, FIRST, None, V(Outcome.POISON, Action.REJECT, poison_reason="no_task_id")),
    (INVALID, FIRST, None, V(Outcome.FAILURE, Action.CONCLUDE, code="INVALID_INPUT")),
    (BY_CLIENT, FIRST, None, V(Outcome.CANCELLED_BY_CLIENT, Action.CONCLUDE, "TASK_CANCELLED")),
    (BY_CLIENT, FIRST, HELD, V(Outcome.PUBLISH_FAILED, NACK, "TASK_CANCELLED", reason=HELD)),
    (Stopped(Outcome.CANCELLED), FIRST, None, V(Outcome.CANCELLED, Action.NONE)),
    (Stopped(Outcome.PUBLISH_FAILED), FIRST, None, V(Outcome.PUBLISH_FAILED, NACK, reason=HELD)),
    (
        Stopped(Outcome.PUBLISH_FAILED),
        FIRST,
        Reason.ABORTED,
        V(Outcome.SHUTDOWN_REQUEUED, NACK, reason=Reason.ABORTED),
    ),
    (
        Stopped(Outcome.SHUTDOWN_REQUEUED),
        FIRST,
        None,
        V(Outcome.SHUTDOWN_REQUEUED, NACK, reason=Reason.ABORTED),
    ),
    (HandedOff(), FIRST, None, V(Outcome.DETACHED, Action.ACK)),
    (
        HandedOff(already=True),
        FIRST,
        None,
        V(Outcome.DETACHED, Action.ACK, reason=Reason.ALREADY_HANDED_OUT),
    ),
    (
        GivenBack(Outcome.SHUTDOWN_REQUEUED, Reason.NEVER_STARTED),
        FIRST,
        None,
        V(Outcome.SHUTDOWN_REQUEUED, NACK, reason=Reason.NEVER_STARTED),
    ),
    (GivenBack(Outcome.CANCELLED), FIRST, None, V(Outcome.CANCELLED, NACK)),
    (LAPSED, FIRST, None, V(Outcome.CANCELLED, NACK, reason=Reason.LEASE_LAPSED)),
    (EngineFailed(), FIRST, None, V(Outcome.ENGINE_ERROR, NACK, counted=True)),
    (
        Swept(OK, Reason.SWEPT_RESULT),
        FIRST,
        None,
        V(Outcome.SUCCESS, Action.NONE, reason=Reason.SWEPT_RESULT),
    ),
    (
        Swept(AGAIN, Reason.SWEPT_RESULT),  # a swept failure is never retried
        FIRST,
        None,
        V(Outcome.FAILURE, Action.NONE, code="BUSY", reason=Reason.SWEPT_RESULT),
    ),
    (
        Swept(Failure("WORKER_DIED", "x"), Reason.SWEPT_EXPIRY),
        FIRST,
        HELD,
        V(Outcome.PUBLISH_FAILED, Action.NONE, code="WORKER_DIED", reason=Reason.SWEPT_EXPIRY),
    ),
]


@pytest.mark.parametrize(("ending", "attempt", "unsent", "expected"), CASES)
def test_each_ending_settles_as_its_table_row_says(
    ending: Ending, attempt: Attempt, unsent: Reason | None, expected: Verdict
) -> None:
    assert decide(ending, attempt, unsent) == expected


@pytest.mark.parametrize(
    ("ending", "attempt", "owed"),
    [
        (OK, FIRST, OK),
        (BAD, FIRST, BAD),
        (AGAIN, FIRST, None),  # requeued, not reported
        (AGAIN, LAST, AGAIN),
        (POISON, FIRST, POISON.failure),
        (NOBODY, FIRST, None),  # nobody to report to
        (BY_CLIENT, FIRST, CANCELLED_BY_CLIENT),
        (Stopped(Outcome.CANCELLED), FIRST, None),
        (Stopped(Outcome.PUBLISH_FAILED), FIRST, None),
        (Stopped(Outcome.SHUTDOWN_REQUEUED), FIRST, None),
        (HandedOff(), FIRST, None),
        (GivenBack(Outcome.CANCELLED), FIRST, None),
        (LAPSED, FIRST, None),  # a run whose lease lapsed reports nothing it concluded
        (EngineFailed(), FIRST, None),
        (Swept(AGAIN, Reason.SWEPT_RESULT), FIRST, AGAIN),
    ],
)
def test_the_terminal_report_owed_for_each_ending(
    ending: Ending, attempt: Attempt, owed: object
) -> None:
    assert terminal_report(ending, attempt) == owed


attempts = st.integers(1, 50).flatmap(
    lambda limit: st.builds(Attempt, st.integers(1, limit), st.just(limit), st.booleans())
)
codes = st.from_regex(r"[A-Z][A-Z0-9_]{0,10}", fullmatch=True)


@given(attempts, codes, st.none() | st.floats(0, 60))
def test_a_retryable_failure_requeues_counted_below_the_limit_and_concludes_at_it(
    attempt: Attempt, code: str, delay_s: float | None
) -> None:
    failure = Failure(code, "m", retryable=True, retry_delay_s=delay_s)
    settled = decide(failure, attempt)
    if attempt.number < attempt.limit:
        assert settled == V(Outcome.RETRY, NACK, code=code, counted=True)
        assert terminal_report(failure, attempt) is None
    else:
        assert settled == V(Outcome.FAILURE, Action.CONCLUDE, code=code)
        assert terminal_report(failure, attempt) == failure


@given(attempts, codes, st.booleans(), st.sampled_from(list(Reason)))
def test_a_report_that_did_not_get_out_always_goes_back_uncounted(
    attempt: Attempt, code: str, retryable: bool, why: Reason
) -> None:
    failure = Failure(code, "m", retryable=retryable)
    for ending in (OK, failure, BY_CLIENT, INVALID):
        if terminal_report(ending, attempt) is None:
            continue
        settled = decide(ending, attempt, why)
        assert (settled.action, settled.counted, settled.reason) == (NACK, False, why)
        expected = Outcome.SHUTDOWN_REQUEUED if why is Reason.ABORTED else Outcome.PUBLISH_FAILED
        assert settled.outcome is expected


@pytest.mark.parametrize(("ending", "attempt", "unsent", "expected"), CASES)
def test_a_withdrawn_delivery_sends_nothing_more_unless_a_shutdown_gave_it_back(
    ending: Ending, attempt: Attempt, unsent: Reason | None, expected: Verdict
) -> None:
    settled = withdrawn(decide(ending, attempt, unsent))
    if expected.outcome is Outcome.SHUTDOWN_REQUEUED:
        assert settled == expected
    else:
        assert (settled.outcome, settled.action, settled.counted) == (
            Outcome.CANCELLED,
            Action.NONE,
            False,
        )
