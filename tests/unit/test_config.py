"""gpusched.config: each setting declared once, read from its flag or its variable,
validated with an error naming both, and documented in docs/reference/configuration.md."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from gpusched.config import (DEFAULT_PLACEMENT, AccountingSettings, AdmissionSettings, ConsumerSettings, KafkaSettings, NodeAgentSettings,
                             NodeHostSettings, PlacerSettings, PreemptorSettings, ProcessSettings, SecuritySettings, Settings,
                             SettingsError, kafka_settings)

MODELS = (KafkaSettings, SecuritySettings, AdmissionSettings, PlacerSettings, PreemptorSettings, NodeAgentSettings,
          NodeHostSettings, AccountingSettings, ConsumerSettings, ProcessSettings)
# the models whose flags one service's command line holds
SERVICES = {service: (KafkaSettings, SecuritySettings, own) for service, own in
            (("admission", AdmissionSettings), ("placer", PlacerSettings), ("preemptor", PreemptorSettings),
             ("node-agent", NodeAgentSettings))}
SERVICES["consumer"] = (KafkaSettings, AccountingSettings, ConsumerSettings)
SERVICES["node-host"] = (KafkaSettings, NodeHostSettings)
DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "configuration.md"


def _parse(cls: type[Settings], argv: list[str], env: dict[str, str]):
    parser = argparse.ArgumentParser()
    cls.add_args(parser, env)
    return cls.from_args(parser.parse_args(argv), env)


def test_every_setting_has_a_source_and_a_meaning():
    for cls in MODELS:
        for name, (flag, env) in cls.sources().items():
            assert flag or env, f"{cls.__name__}.{name}"
            assert cls.model_fields[name].description, f"{cls.__name__}.{name}"


def test_no_variable_is_declared_twice_nor_a_flag_twice_in_one_service():
    envs = [e for cls in MODELS for _, e in cls.sources().values() if e]
    assert len(envs) == len(set(envs))
    for service, models in SERVICES.items():
        parser = argparse.ArgumentParser()
        for cls in models:
            cls.add_args(parser, {})   # argparse refuses a flag added twice


def _documented() -> dict[str, dict[str, list[str]]]:
    """Model name -> flag or variable -> its row, from the tables of docs/reference/configuration.md."""
    tables: dict[str, dict[str, list[str]]] = {}
    rows: dict[str, list[str]] = {}
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            found = re.search(r"`(\w+Settings)`", line)
            rows = tables.setdefault(found.group(1), {}) if found else {}
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and (cells[0].startswith("`") or cells[1].startswith("`")):
            rows[(cells[0] or cells[1]).strip("`")] = cells
    return tables


def test_the_documentation_lists_every_setting_with_its_default():
    tables = _documented()
    for cls in MODELS:
        rows = tables[cls.__name__]
        for name, (flag, env) in cls.sources().items():
            row, default = rows[flag or env], cls.model_fields[name].default
            assert row[:2] == [f"`{flag}`" if flag else "", f"`{env}`" if env else ""], name
            shown = {True: "on", False: "off"}.get(default, default) if isinstance(default, bool) else default
            shown = "none" if shown == () else shown
            assert row[2] == ('""' if shown == "" else str(shown)), name
        assert len(rows) == len(cls.model_fields), cls.__name__


def test_a_flag_wins_over_its_variable_and_the_variable_over_the_default():
    env = {"GPUSCHED_PARTITIONS": "8", "GPUSCHED_TOPIC_PREFIX": "t."}
    settings = _parse(KafkaSettings, ["--partitions", "16"], env)
    assert (settings.partitions, settings.topic_prefix, settings.bootstrap) == (16, "t.", "127.0.0.1:19092")
    assert _parse(KafkaSettings, [], {}).parallel_replay_min == 100_000
    assert _parse(KafkaSettings, [], {"GPUSCHED_PARALLEL_REPLAY_MIN": "0"}).parallel_replay_min == 0


def test_switches_come_from_a_flag_or_a_variable_set_to_1():
    assert _parse(SecuritySettings, [], {"GPUSCHED_INSECURE": "1"}).insecure
    assert _parse(SecuritySettings, ["--insecure"], {}).insecure
    assert not _parse(SecuritySettings, [], {}).insecure
    placer = _parse(PlacerSettings, ["--no-snapshots", "--queue", "priority"], {})
    assert (placer.no_snapshots, placer.backfill, placer.queue, placer.listen) == (True, True, "priority", "127.0.0.1:0")
    assert not _parse(PlacerSettings, ["--no-backfill"], {}).backfill   # a switch on by default is turned off


def test_reservation_settings_of_the_placer():
    placer = _parse(PlacerSettings, [], {})
    assert (placer.queue, placer.backfill, placer.reserve_after, placer.reservation_depth,
            placer.default_estimate, placer.pool_reserve_after) == ("fair-share", True, 300.0, 2, 86400.0, {})
    placer = _parse(PlacerSettings, ["--pool-reserve-after", "a100=600", "--pool-reserve-after", "cpu=inf",
                                     "--reserve-after", "inf", "--reservation-depth", "0"], {})
    assert placer.pool_reserve_after == {"a100": 600.0, "cpu": float("inf")}
    assert (placer.reserve_after, placer.reservation_depth) == (float("inf"), 0)
    for argv, named in ((["--pool-reserve-after", "a100"], "--pool-reserve-after"),
                        (["--pool-reserve-after", "a100=-1"], "--pool-reserve-after"),
                        (["--reserve-after", "-5"], "--reserve-after"),
                        (["--default-estimate", "0"], "--default-estimate"),
                        (["--reservation-depth", "-1"], "--reservation-depth")):
        with pytest.raises(SettingsError, match=named):
            _parse(PlacerSettings, argv, {})


def test_the_placer_places_with_the_default_policy_unless_told():
    # best-fit, the cheapest per decision (config.DEFAULT_PLACEMENT says why not fgd-lookahead);
    # fgd-lookahead is one flag away.
    from gpusched_placer.main import scheduler_config

    assert scheduler_config(_parse(PlacerSettings, [], {})).placement == DEFAULT_PLACEMENT == "best-fit"
    argv = ["--placement", "fgd-lookahead"]
    assert scheduler_config(_parse(PlacerSettings, argv, {})).placement == "fgd-lookahead"


def test_the_guarantee_hold_is_a_placer_flag_with_the_schedulers_default():
    from gpusched.policies.queueing.guarantee_hold import DEFAULT_GUARANTEE_HOLD_S
    from gpusched_placer.main import scheduler_config

    assert scheduler_config(_parse(PlacerSettings, [], {})).guarantee_hold_s == DEFAULT_GUARANTEE_HOLD_S
    assert scheduler_config(_parse(PlacerSettings, ["--guarantee-hold", "60"], {})).guarantee_hold_s == 60.0
    for bad in ("-1", "inf"):
        with pytest.raises(SettingsError, match="--guarantee-hold"):
            _parse(PlacerSettings, ["--guarantee-hold", bad], {})


def test_the_budget_of_jobs_tested_and_its_cursor_are_placer_flags():
    from gpusched.policies.scheduler import DEFAULT_MAX_JOB_TEST
    from gpusched_placer.main import scheduler_config

    config = scheduler_config(_parse(PlacerSettings, [], {}))
    # The head below the scheduler's: the bounded cycle takes 150 jobs (the next test).
    assert (config.max_job_test, config.job_test_head) == (DEFAULT_MAX_JOB_TEST, 100)
    config = scheduler_config(_parse(PlacerSettings, ["--max-job-test", "300", "--job-test-head", "20"], {}))
    assert (config.max_job_test, config.job_test_head) == (300, 20)
    for argv, named in ((["--max-job-test", "0"], "--max-job-test"), (["--job-test-head", "-1"], "--job-test-head")):
        with pytest.raises(SettingsError, match=named):
            _parse(PlacerSettings, argv, {})


def test_the_bound_on_a_cycles_time_is_a_placer_flag_on_by_default():
    import math
    from gpusched_placer.main import scheduler_config

    config = scheduler_config(_parse(PlacerSettings, [], {}))
    assert (config.max_cycle_s, config.min_job_test) == (0.025, 150)
    assert config.min_job_test > config.job_test_head   # a continued round moves on
    assert scheduler_config(_parse(PlacerSettings, ["--max-cycle-ms", "0"], {})).max_cycle_s == math.inf
    config = scheduler_config(_parse(PlacerSettings, ["--max-cycle-ms", "40", "--min-job-test", "600"], {}))
    assert (config.max_cycle_s, config.min_job_test) == (0.04, 600)
    for argv, named in ((["--max-cycle-ms", "-1"], "--max-cycle-ms"), (["--min-job-test", "0"], "--min-job-test"),
                        (["--max-cycle-ms", "40", "--min-job-test", "100"], "--min-job-test")):
        with pytest.raises(SettingsError, match=named):
            _parse(PlacerSettings, argv, {})


@pytest.mark.parametrize("cls, argv, env, named", [
    (KafkaSettings, [], {"GPUSCHED_PARTITIONS": "x"}, "--partitions / env GPUSCHED_PARTITIONS"),
    (KafkaSettings, ["--parallel-replay-min", "-1"], {}, "--parallel-replay-min / env GPUSCHED_PARALLEL_REPLAY_MIN"),
    (KafkaSettings, [], {"GPUSCHED_PARALLEL_REPLAY_MIN": "1e5"}, "GPUSCHED_PARALLEL_REPLAY_MIN"),
    (KafkaSettings, ["--kafka-security-protocol", "TLS"], {}, "--kafka-security-protocol"),
    (AdmissionSettings, ["--job-retention", "inf"], {}, "--job-retention / env GPUSCHED_JOB_RETENTION_S"),
    (AdmissionSettings, [], {"GPUSCHED_SUBMIT_RATE": "-5"}, "GPUSCHED_SUBMIT_RATE"),
    (PlacerSettings, ["--snapshot-every-events", "-1"], {}, "--snapshot-every-events: "),
    (PreemptorSettings, ["--heartbeat-timeout", "0"], {}, "--heartbeat-timeout: "),
    (NodeAgentSettings, ["--grace", "0"], {}, "--grace: "),
    (NodeAgentSettings, ["--lease", "inf"], {}, "--lease: "),
    (NodeAgentSettings, ["--mps", "maybe"], {}, "--mps: "),
    (NodeAgentSettings, ["--label", "rack=r1", "--label", "rack"], {}, "--label: "),
    (ConsumerSettings, ["--connect-timeout", "0"], {}, "--connect-timeout: "),
])
def test_a_bad_value_names_its_flag_and_variable(cls, argv, env, named):
    with pytest.raises(SettingsError, match=re.escape(named)):
        _parse(cls, argv, env)


def test_a_bad_variable_without_a_flag_is_named():
    with pytest.raises(SettingsError, match="env GPUSCHED_GRPC_MAX_RECEIVE_BYTES"):
        ProcessSettings.from_env({"GPUSCHED_GRPC_MAX_RECEIVE_BYTES": "lots"})
    assert ProcessSettings.from_env({"GPUSCHED_NATIVE": "0"}).native == "0"
    with pytest.raises(SettingsError, match="env GPUSCHED_NATIVE"):
        ProcessSettings.from_env({"GPUSCHED_NATIVE": "no"})


def test_a_service_stops_on_a_bad_setting_with_one_line(monkeypatch):
    monkeypatch.setenv("GPUSCHED_PARTITIONS", "0")
    parser = argparse.ArgumentParser()
    KafkaSettings.add_args(parser)
    with pytest.raises(SystemExit, match="invalid settings: --partitions / env GPUSCHED_PARTITIONS: .*greater"):
        kafka_settings(parser.parse_args([]))


def test_a_sasl_login_without_its_password_is_refused():
    with pytest.raises(SettingsError, match="needs a user, a password and a CA"):
        _parse(KafkaSettings, ["--kafka-security-protocol", "sasl_ssl", "--kafka-user", "u", "--kafka-ca", "/ca"], {})
    settings = _parse(KafkaSettings, ["--kafka-security-protocol", "sasl_ssl", "--kafka-user", "u", "--kafka-ca", "/ca"],
                      {"GPUSCHED_KAFKA_PASSWORD": "pw"})
    assert settings.password == "pw" and "pw" not in repr(settings)


def test_a_node_agent_keeps_its_flags_and_their_defaults():
    own = _parse(NodeAgentSettings, ["--name", "n1", "--label", "rack=r1", "--label", "zone=z", "--run-processes",
                                     "--simulated-usage", "nb-*=0", "--mps", "off"], {})
    assert (own.name, own.label, own.run_processes, own.simulated_usage, own.mps) == \
        ("n1", ("rack=r1", "zone=z"), True, ("nb-*=0",), "off")
    assert _parse(NodeAgentSettings, [], {}) == NodeAgentSettings()
    assert (NodeAgentSettings().pool, NodeAgentSettings().grace, NodeAgentSettings().label) == ("default", 10.0, ())


def test_a_node_agent_stops_on_a_bad_flag_before_connecting():
    from gpusched_node_agent.main import main
    with pytest.raises(SystemExit, match="invalid settings: --grace: Input should be greater than 0"):
        main(["--bootstrap", "127.0.0.1:9", "--insecure", "--grace", "0"])


def test_the_reports_take_their_database_and_cluster_from_the_settings(monkeypatch):
    from gpusched.consumers.reports import _parse, _parser
    monkeypatch.setenv("GPUSCHED_ACCOUNTING_DB", "sqlite:///from-env.db")
    monkeypatch.setenv("GPUSCHED_TOPIC_PREFIX", "env.")
    args = _parse(_parser("r", ""), [])
    assert (args.db, args.topic_prefix) == ("sqlite:///from-env.db", "env.")
    args = _parse(_parser("r", ""), ["--topic-prefix", "flag.", "--db", "sqlite:///flag.db"])
    assert (args.db, args.topic_prefix) == ("sqlite:///flag.db", "flag.")
    monkeypatch.delenv("GPUSCHED_ACCOUNTING_DB")
    monkeypatch.delenv("GPUSCHED_TOPIC_PREFIX")
    assert (_parse(_parser("r", ""), []).db, _parse(_parser("r", ""), []).topic_prefix) == \
        ("sqlite:///gpusched-accounting.db", "gpusched.")


def test_only_adds_the_flags_named():
    parser = argparse.ArgumentParser()
    KafkaSettings.add_args(parser, {}, only=("topic_prefix",))
    assert [a.dest for a in parser._actions if a.dest != "help"] == ["topic_prefix"]
