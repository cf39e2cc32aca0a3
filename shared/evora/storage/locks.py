"""Every advisory-lock key Evora takes, in one place so no two can collide.

Session-level locks on these keys elect one active replica (sweeper, projector) or
serialise migrations. Any 64-bit constants work, as long as every process agrees. (The
limited claim, in SQL, also takes transaction-level locks in PostgreSQL's separate
two-integer space, class 0x45564F52, while it makes a key's token bucket:
functions/claims_and_transitions.sql.)
"""

from __future__ import annotations

from typing import Final

MIGRATIONS: Final = 0x45564F52_41000001
PROJECTOR: Final = 0x45564F52_41000002
SWEEPER: Final = 0x45564F52_41000003
PIPELINE_ARCHIVE: Final = 0x45564F52_41000004
