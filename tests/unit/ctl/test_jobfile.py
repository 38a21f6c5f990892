"""Job files: the API's JobSpec fields, each mistake named by its field."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from gpusched.cli import cli
from gpusched.ctl.jobfile import JobFileError, load, parse
from gpusched.v1 import types_pb2


def test_a_job_file_fills_the_spec_and_the_defaults_of_the_python_client(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: ft\nteam: nlp\nworkers: 2\nkind: inference\n"
                    "resources: {gpus: 8, gpu_models: [H100-80GB]}\ncommand: [torchrun, train.py]\n"
                    "checkpoint_interval: 10m\nmax_runtime: 1h30m\nsimulated_duration: 2.5\n---\n"
                    "name: other\nteam: nlp\npreemptible: false\n---\nname: third\npreemptible: true\n")
    first, second, third = load(path)
    assert (first.name, first.team, first.workers, first.kind) == ("ft", "nlp", 2, types_pb2.JOB_KIND_INFERENCE)
    assert first.resources.gpus == 8 and list(first.resources.gpu_models) == ["H100-80GB"]
    assert first.resources.cpu_milli == 1000 and first.resources.memory_mib == 4096   # defaults kept
    assert list(first.command) == ["torchrun", "train.py"] and first.checkpoint_interval.ToSeconds() == 600
    assert first.max_runtime.ToSeconds() == 5400 and first.simulated_duration.ToMilliseconds() == 2500
    assert first.pool == "default" and first.priority_class == "training"
    # preemptible: left unset (the API's default, true), or as the file says
    assert not first.HasField("preemptible")
    assert second.HasField("preemptible") and not second.preemptible
    assert third.HasField("preemptible") and third.preemptible


@pytest.mark.parametrize("doc, message", [
    ({"name": "x", "gpus": 2}, "gpus: unknown field"),
    ({"name": "x", "resources": {"gpu": 1}}, "resources.gpu: unknown field"),
    ({"name": "x", "workers": "two"}, "workers: must be an integer, got 'two'"),
    ({"name": "x", "workers": True}, "workers: must be an integer"),
    ({"name": "x", "resources": {"gpus": 1.5}}, "resources.gpus: must be an integer"),
    ({"name": "x", "command": "python train.py"}, "command: must be a list"),
    ({"name": "x", "command": ["a", {"b": 1}]}, "command[1]: must be a string"),
    ({"name": "x", "preemptible": "yes please"}, "preemptible: must be true or false"),
    ({"name": "x", "kind": "batch"}, "kind: unknown value 'batch' (one of training, inference)"),
    ({"name": "x", "resources": 4}, "resources: must be a mapping"),
    ({"name": "x", "max_runtime_s": 60}, "max_runtime_s: now max_runtime, a span"),
    ({"name": "x", "max_runtime": "1 hour"}, "max_runtime: must be a span"),
    ({"name": "x", "max_runtime": True}, "max_runtime: must be a span"),
    ({"name": "x", "checkpoint_interval": -5}, "checkpoint_interval: must not be negative"),
    (["name", "x"], "a job is a mapping of JobSpec fields, got list"),
    ({"name": "x", "retry": {"cause": "exit"}}, "retry: must be a list"),
    ({"name": "x", "retry": ["exit"]}, "retry[0]: must be a mapping"),
    ({"name": "x", "retry": [{"cause": "oom"}, {"cause": "disk"}]}, "retry[1].cause: unknown value 'disk' "
                                                                   "(one of exit, oom, hang, node, preemption)"),
    ({"name": "x", "retry": [{"cause": "exit", "action": "retry"}]}, "retry[0].action: unknown value 'retry' "
                                                                    "(one of count, ignore, fail)"),
])
def test_a_bad_job_names_its_field(doc, message):
    with pytest.raises(JobFileError) as err:
        parse(doc)
    assert str(err.value).startswith(message), err.value


def test_gpusched_submit_reports_a_bad_file_by_field_and_document_before_connecting(tmp_path):
    path = tmp_path / "jobs.yaml"
    path.write_text("name: a\nteam: t\n---\nname: b\nresources:\n  gpus: many\n")
    # nothing listens on the endpoint: the file is refused before any call
    result = CliRunner().invoke(cli, ["--endpoint", "127.0.0.1:9", "submit", "-f", str(path)])
    assert result.exit_code == 1
    assert f"{path} (document 2): resources.gpus: must be an integer, got 'many'" in result.output
    assert "Traceback" not in result.output


def test_a_file_that_is_not_yaml_is_refused_with_its_line(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: [unclosed\n")
    result = CliRunner().invoke(cli, ["submit", "-f", str(path)])
    assert result.exit_code == 1 and f"{path}: not YAML" in result.output and "line" in result.output


def test_span_and_kind_flags_read_as_a_job_file_reads_them(monkeypatch):
    """``--duration 10m`` as the README's tour types it, and ``--kind inference``; a bad
    span is named by its field before any call."""
    from gpusched.ctl import jobs
    sent = []
    monkeypatch.setattr(jobs.jobfile, "parse", lambda doc, where=None: sent.append(doc) or parse(doc, where))
    result = CliRunner().invoke(cli, ["--endpoint", "127.0.0.1:9", "submit", "--name", "s", "--team", "t",
                                      "--duration", "10m", "--max-runtime", "90", "--checkpoint-interval", "1h30m",
                                      "--kind", "inference", "--key", "k"])
    spec = parse(sent[0])
    assert spec.simulated_duration.ToSeconds() == 600 and spec.max_runtime.ToSeconds() == 90
    assert spec.checkpoint_interval.ToSeconds() == 5400 and spec.kind == types_pb2.JOB_KIND_INFERENCE
    assert result.exit_code != 0   # nothing listens: the spec was built, the call failed
    bad = CliRunner().invoke(cli, ["--endpoint", "127.0.0.1:9", "submit", "--name", "s", "--duration", "10x"])
    assert bad.exit_code != 0 and "simulated_duration: must be a span" in bad.output


def test_retry_rules_read_by_cause_and_action():
    spec = parse({"name": "x", "retry": [{"cause": "exit", "exit_codes": [2, 127], "action": "fail"},
                                         {"cause": "oom", "action": "count", "max_restarts": 1}]})
    assert [(r.cause, list(r.exit_codes), r.action, r.max_restarts) for r in spec.retry] == [
        (types_pb2.FAILURE_CAUSE_EXIT, [2, 127], types_pb2.RETRY_ACTION_FAIL, 0),
        (types_pb2.FAILURE_CAUSE_OOM, [], types_pb2.RETRY_ACTION_COUNT, 1)]


def test_after_flags_read_as_depends_on(monkeypatch):
    from gpusched.ctl import jobs
    sent = []
    monkeypatch.setattr(jobs.jobfile, "parse", lambda doc, where=None: sent.append(doc) or parse(doc, where))
    CliRunner().invoke(cli, ["--endpoint", "127.0.0.1:9", "submit", "--name", "eval", "--after", "job-a",
                             "--after", "job-b:finished"])
    spec = parse(sent[0])
    assert [(d.job, d.when) for d in spec.depends_on] == [
        ("job-a", types_pb2.DEPENDENCY_CONDITION_SUCCEEDED), ("job-b", types_pb2.DEPENDENCY_CONDITION_FINISHED)]
    bad = CliRunner().invoke(cli, ["--endpoint", "127.0.0.1:9", "submit", "--name", "x", "--after", "job-a:later"])
    assert bad.exit_code != 0 and "depends_on[0].when: unknown value 'later'" in bad.output


def test_a_topology_request_reads_from_a_job_file_and_a_wrong_key_is_named():
    spec = parse({"name": "g", "team": "nlp", "workers": 8,
                  "topology": {"required": "rack", "preferred": "block", "slice": {"level": "block", "workers": 4}}})
    assert spec.HasField("topology")
    assert (spec.topology.required, spec.topology.preferred) == ("rack", "block")
    assert (spec.topology.slice.level, spec.topology.slice.workers) == ("block", 4)
    assert not parse({"name": "g", "team": "nlp"}).HasField("topology")
    with pytest.raises(JobFileError, match=r"^topology\.slice\.size: unknown field"):
        parse({"name": "g", "topology": {"slice": {"size": 4}}})
    with pytest.raises(JobFileError, match=r"^topology\.slice\.workers: must be an integer"):
        parse({"name": "g", "topology": {"slice": {"level": "block", "workers": "four"}}})
