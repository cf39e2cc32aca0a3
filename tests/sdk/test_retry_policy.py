"""Which failures are repeated, and how long to wait in between."""

from __future__ import annotations

import pytest

import evora
from evora.protocol.retries import RetryBackoff
from evora.sdk._http import should_retry
from evora.sdk.errors import EvoraClientError, error_from_response

NOT_SENT = evora.EvoraConnectionError("refused", request_sent=False)
SENT = evora.EvoraConnectionError("reset", request_sent=True)


def http(status: int) -> EvoraClientError:
    return error_from_response(status, b"")


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_request_that_never_left_is_always_repeated(idempotent: bool) -> None:
    assert should_retry(NOT_SENT, idempotent=idempotent)


@pytest.mark.parametrize("error", [SENT, http(502), http(503), http(504)])
def test_ambiguous_failures_are_repeated_only_for_idempotent_calls(error: EvoraClientError) -> None:
    assert should_retry(error, idempotent=True)
    assert not should_retry(error, idempotent=False)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 422, 429, 500])
def test_final_answers_are_never_repeated(status: int) -> None:
    assert not should_retry(http(status), idempotent=True)


def test_other_client_errors_are_not_repeated() -> None:
    assert not should_retry(EvoraClientError("the answer is not JSON"), idempotent=True)


def test_backoff_grows_exponentially_up_to_the_cap() -> None:
    backoff = RetryBackoff(initial=0.5, max_delay=4.0, multiplier=2.0)
    assert [backoff.ceiling(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff.ceiling(1_000_000) == 4.0  # no OverflowError after days of retrying


@pytest.mark.parametrize("retry", [1, 2, 3, 10, 5000])
def test_jitter_stays_between_half_and_all_of_the_ceiling(retry: int) -> None:
    backoff = RetryBackoff(initial=0.2, max_delay=5.0)
    ceiling = backoff.ceiling(retry)
    assert backoff.delay(retry, rand=lambda: 0.0) == ceiling / 2
    assert backoff.delay(retry, rand=lambda: 0.999999) == pytest.approx(ceiling, rel=1e-5)
    assert all(ceiling / 2 <= backoff.delay(retry) <= ceiling for _ in range(200))


@pytest.mark.parametrize(
    "kwargs", [{"initial": 0}, {"initial": 2, "max_delay": 1}, {"multiplier": 0.5}]
)
def test_backoff_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="initial"):
        RetryBackoff(**kwargs)
