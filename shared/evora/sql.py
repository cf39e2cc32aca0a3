"""`evora.sql_enqueue` under its first name, so `from evora import sql` keeps working."""

from evora.sql_enqueue import *  # noqa: F403
