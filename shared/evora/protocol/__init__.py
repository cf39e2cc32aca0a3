"""Evora's HTTP wire contract in one place: the job and event state names, the limits every
request is held to, and the problem codes errors carry. The SDK depends on this package
alone among Evora's; the services and the dashboard take the same values from here."""
