"""`evora migrate` tries a transaction again when PostgreSQL refused it a lock in time or
broke a deadlock by rolling it back: either way nothing of it was applied."""

from __future__ import annotations

import asyncpg
import pytest

from evora.storage.migrate import MigrationError, _retrying_locks


@pytest.mark.parametrize("refusal", [asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError])
async def test_a_refused_attempt_is_tried_again(refusal: type[Exception]) -> None:
    attempts = 0

    async def attempt() -> None:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise refusal("refused")

    await _retrying_locks("a migration", attempt, for_s=5)
    assert attempts == 3


async def test_attempts_stop_after_their_time_with_an_error_that_says_why() -> None:
    async def attempt() -> None:
        raise asyncpg.DeadlockDetectedError("deadlock detected")

    with pytest.raises(MigrationError, match="could not get its locks"):
        await _retrying_locks("a migration", attempt, for_s=0.3)


async def test_any_other_error_is_not_tried_again() -> None:
    attempts = 0

    async def attempt() -> None:
        nonlocal attempts
        attempts += 1
        raise asyncpg.UndefinedTableError("no such table")

    with pytest.raises(asyncpg.UndefinedTableError):
        await _retrying_locks("a migration", attempt, for_s=5)
    assert attempts == 1
