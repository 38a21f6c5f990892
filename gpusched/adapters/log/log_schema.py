"""The refusal of a record of a newer log schema than this code reads (``gpusched.version``).

Folding such a record would give this process another state than its upgraded
replicas, and skipping it too: the process stops with one line naming the record, its
schema and its writer (``NewerLogSchema`` is a SystemExit, which no handler of
``Exception`` swallows and which an asyncio task raises out of the event loop). The
codec raises it; the relay refuses a node's report of a newer schema instead, into the
dead letters, since reports do not make the state (docs/guide/deploying.md, "Upgrades").
"""
from __future__ import annotations

from gpusched.version import LOG_SCHEMA, VERSION


class NewerLogSchema(SystemExit):
    def __init__(self, schema: int, producer: str, where: str = "") -> None:
        self.schema, self.producer = schema, producer
        super().__init__(f"{where + ': ' if where else ''}a record of log schema {schema} (written by "
                         f"{producer or 'an unnamed producer'}); this gpusched {VERSION} reads log schemas up to "
                         f"{LOG_SCHEMA}: upgrade it (docs/guide/deploying.md, \"Upgrades\")")

    def at(self, where: str) -> NewerLogSchema:
        """The same refusal, naming where the record is (topic[partition]@offset)."""
        return NewerLogSchema(self.schema, self.producer, where)
