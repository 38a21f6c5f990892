"""Logs written by earlier code replay in this one: each fixture log of
tests/fixtures/logs (real services' pool log, one per log schema, recorded by
record_log.py and never replaced) is the file it was, and folds as a service folds it
(``fold_records``) to the digest recorded when it was written, every record applied
(docs/guide/deploying.md, "Upgrades")."""
from __future__ import annotations

import collections
import gzip
import hashlib
import json
from pathlib import Path

import pytest

from gpusched.adapters.log.publisher import DeadLetters
from gpusched.version import LOG_SCHEMA
from tests.fixtures.logs.fixture_log import replay

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
METAS = sorted(FIXTURES.glob("schema-*.json"))


def test_there_is_a_fixture_log_for_every_schema_up_to_this_codes():
    assert [json.loads(path.read_text())["schema"] for path in METAS] == list(range(1, LOG_SCHEMA + 1))


@pytest.mark.parametrize("meta_path", METAS, ids=[path.stem for path in METAS])
async def test_a_fixture_log_replays_to_its_recorded_digests(meta_path):
    meta = json.loads(meta_path.read_text())
    frames = gzip.decompress(meta_path.with_name(f"{meta_path.stem}.log.gz").read_bytes())
    assert hashlib.sha256(frames).hexdigest() == meta["sha256"]   # the fixture is the log as written
    letters = DeadLetters(None, "fixture")
    digests, types = await replay(frames, letters)
    assert list(letters.skipped) == []
    assert len(types) == meta["records"] and collections.Counter(types) == meta["event_types"]
    assert digests == meta["digests"]
