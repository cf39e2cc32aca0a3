"""The job domain: the state machine, the typed errors every service raises, and job ids as
paths name them. The shapes on the wire are in evora.protocol."""
