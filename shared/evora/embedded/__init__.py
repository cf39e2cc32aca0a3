"""Real database servers run as child processes, for ``evora dev`` and the test suite.

Blocking by design: callers on an event loop run start() and stop() in a thread.
"""

from evora.embedded._process import EmbeddedServerError
from evora.embedded.mongo import LocalMongo
from evora.embedded.postgres import LocalPostgres

__all__ = ["EmbeddedServerError", "LocalMongo", "LocalPostgres"]
