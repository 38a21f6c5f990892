"""What the commands print (gpusched.ctl.output): the API's objects whole, numbers as
numbers; text with nothing a terminal (or rich's markup) would act on."""
from __future__ import annotations

import json

import click
from click.testing import CliRunner

from gpusched.ctl.output import as_dict, echo_lines, printable, table
from gpusched.v1 import types_pb2


def test_control_characters_and_invisible_formatting_are_printed_as_escapes():
    assert printable("plain text, é, 漢字") == "plain text, é, 漢字"
    assert printable("a\x1b[2Jb\nc\td\x07\x7f\x9b") == "a\\x1b[2Jb\\nc\\td\\x07\\x7f\\x9b"
    assert printable("left\u202eright\u2066") == "left\\u202eright\\u2066"   # bidirectional overrides


def _printed(command) -> str:
    result = CliRunner().invoke(click.command()(command))
    assert result.exit_code == 0, result.output
    return result.output


def test_tables_and_lines_show_cells_as_text():
    rows = [{"reason": "\x1b]0;owned\x07 [bold red]not markup[/bold red]"}]
    out = _printed(lambda: table(rows, [("REASON", lambda r: r["reason"])], fmt="table"))
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b]0;owned\\x07 [bold red]not markup[/bold red]" in out
    out = _printed(lambda: echo_lines(["Command:      sh -c \x1b[2J", "Reason:       -"]))
    assert out == "Command:      sh -c \\x1b[2J\nReason:       -\n"


def test_the_apis_objects_have_every_field_and_64_bit_numbers_as_numbers():
    job = types_pb2.Job(job_id="j", spec=types_pb2.JobSpec(
        name="n", workers=1, resources=types_pb2.WorkerResources(gpus=1, cpu_milli=2000, memory_mib=4096)),
        workers=[types_pb2.WorkerAssignment(worker=0, node="n0", gpus=[types_pb2.GpuSlot(index=0, milli=1000)])])
    job.submitted_at.FromSeconds(1_700_000_000)
    shown = json.loads(json.dumps(as_dict(job)))
    assert shown["workers"] == [{"worker": 0, "node": "n0",
                                 "gpus": [{"index": 0, "milli": 1000, "mig_profile": "", "mig_start": 0}]}]
    assert shown["spec"]["resources"]["cpu_milli"] == 2000 and shown["spec"]["resources"]["gpu_memory_mib"] == 0
    assert shown["submitted_at"] == "2023-11-14T22:13:20Z" and shown["ended_at"] is None   # unset: null, not absent
    assert shown["spec"]["max_restarts"] is None and shown["restarts"] == 0
    assert set(shown) == {f.name for f in types_pb2.Job.DESCRIPTOR.fields}
    node = types_pb2.Node(info=types_pb2.NodeInfo(name="x", labels={"rack": "r1"}, cpu_milli=64_000),
                          gpus=[types_pb2.Gpu(info=types_pb2.GpuInfo(index=0), allocated_milli=0)])
    shown = as_dict(node)
    assert shown["info"]["labels"] == {"rack": "r1"} and shown["info"]["cpu_milli"] == 64_000
    assert shown["gpus"][0]["info"]["index"] == 0 and shown["gpus"][0]["allocated_milli"] == 0
