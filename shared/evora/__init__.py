"""Evora, a distributed job queue on PostgreSQL.

`import evora` gives the public SDK (README.md): `evora.Client` for producers and
admins, `evora.Worker` and `evora.Handlers` for worker processes, and the exceptions they
raise. Services and tooling live in the subpackages.
"""

from evora.sdk import *  # noqa: F403  (the SDK's public names are the package's)
from evora.sdk import __all__ as __all__
