"""Evora's HTTP wire contract in one place: the job and event state names, the limits every
request is held to, the problem codes errors carry, the request and response models of every
endpoint (`jobs`, `worker`) and how clients retry (`retries`). The SDK depends on this package
alone among Evora's; the services and the dashboard take the same values from here."""
