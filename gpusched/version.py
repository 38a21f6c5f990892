"""What this code is: the package's version and the schema of the log records it writes.

``VERSION`` follows semantic versioning (docs/guide/deploying.md, "Versions and upgrades"): a
patch release changes no record, a minor release may add to the log's schema and a
major release may drop what an older schema wrote, never without a release between
that reads both.

``LOG_SCHEMA`` numbers the records this code writes: every event's envelope carries it
(``EventEnvelope.schema``; records written before the field existed read as 1). A
reader folds every schema up to its own and stops, naming the record and the upgrade,
at a newer one: skipping a record it cannot understand would give it another state
than its replicas. It grows only with a change an older reader would fold wrongly (a
new event type, a field the reducer must not ignore), and a fixture log of each schema
stays in tests/fixtures/logs/, replayed by every later version. Imports nothing.
"""
VERSION = "0.4.0"
LOG_SCHEMA = 3
