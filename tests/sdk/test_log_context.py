"""The log context the worker binds for each job's task (`evora.logs.bind`)."""

from __future__ import annotations

import contextvars

from evora.logs import bind, context, unbind


def test_a_bind_adds_to_what_is_bound_and_unbind_restores_it() -> None:
    def in_a_task() -> None:
        outer = bind(request_id="r-1", absent=None)
        assert context() == {"request_id": "r-1"}
        inner = bind(job_id="j-1", request_id="r-2", queue=None)
        assert context() == {"request_id": "r-2", "job_id": "j-1"}
        unbind(inner)
        assert context() == {"request_id": "r-1"}
        unbind(outer)
        assert context() == {}

    contextvars.copy_context().run(in_a_task)
    assert context() == {}


def test_tasks_binding_the_same_names_keep_their_own_values() -> None:
    # Each job's task binds its own job_id on a context copied from the claim loop's.
    def job_task(job_id: str) -> dict[str, object]:
        bind(job_id=job_id, queue="q")
        return dict(context())

    first = contextvars.copy_context().run(job_task, "j-1")
    second = contextvars.copy_context().run(job_task, "j-2")
    assert (first, second) == ({"job_id": "j-1", "queue": "q"}, {"job_id": "j-2", "queue": "q"})
    assert context() == {}
