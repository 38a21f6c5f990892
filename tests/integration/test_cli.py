"""``gpusched`` user commands end to end: real CLI processes against a LocalCluster on
the real broker (admission, placer and simulated node-agents as processes)."""
from __future__ import annotations

import asyncio
import json
import signal
import sys

import pytest
import yaml

from gpusched.adapters.broker import dev_pki
from gpusched.local_cluster import LocalCluster
from tests.integration.cli_runs import Cli, first_running, rows


@pytest.fixture
async def cluster(request, kafka_bootstrap, topics, tmp_path):
    """A cluster of one 4-GPU node; the placer's placement policy is the test's parameter
    (``indirect``), else the default."""
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    admission = await cluster.admission()
    placement = getattr(request, "param", None)
    await cluster.placer("placer", *(["--placement", placement] if placement else []))
    await cluster.agent("node-0", "4xH100-80GB", "--usage-interval", "0.25")
    yield cluster, Cli(admission.port, tmp_path)
    await cluster.stop_all()


@pytest.mark.parametrize("cluster", ["best-fit", "fgd-lookahead"], indirect=True)
async def test_submit_from_yaml_get_describe_cancel_and_watch(cluster, tmp_path):
    _, cli = cluster
    job_file = tmp_path / "jobs.yaml"
    job_file.write_text(yaml.safe_dump_all([
        {"name": "short", "team": "nlp", "simulated_duration": 0.5, "resources": {"gpus": 1}},
        {"name": "long", "team": "nlp", "workers": 2, "simulated_duration": "10m",
         "priority_class": "best-effort", "resources": {"gpus": 1, "cpu_milli": 2000}},
        # The node's 4 GPUs: "long" and "huge" never run together. Which one runs depends on
        # the placer's cycles and policy (which submissions its first cycle sees), so the
        # test finds out, then checks what the CLI shows of each.
        {"name": "huge", "team": "cv", "simulated_duration": "10m", "resources": {"gpus": 4}},
    ]))
    out = await cli.run("submit", "-f", str(job_file))
    ids = [line.split()[0].removeprefix("job/") for line in out.splitlines()]
    assert len(ids) == 3 and all(line.endswith("submitted") for line in out.splitlines())
    short, long, huge = ids

    # watch with a job id: its states until it ends, exit 0 for a success
    watched = await cli.run("watch", short)
    assert watched.splitlines()[-1].split()[3] == "Succeeded", watched
    running = await first_running(cli, long, huge)
    waiting = huge if running == long else long
    team = {long: "nlp", huge: "cv"}

    jobs = {j["job_id"]: j for j in json.loads(await cli.run("get", "jobs", "-o", "json"))}
    assert set(jobs) == {short, long, huge}
    assert jobs[long]["spec"]["workers"] == 2 and jobs[long]["spec"]["resources"]["cpu_milli"] == 2000
    assert jobs[running]["phase"] == "JOB_PHASE_RUNNING" and jobs[waiting]["phase"] == "JOB_PHASE_PENDING"
    table = {r["NAME"]: r for r in rows(await cli.run("get", "jobs", "--team", "nlp"))}
    assert set(table) == {"short", "long"}
    assert table["short"]["PHASE"] == "Succeeded" and table["long"]["GPUS"] == "2x1"
    assert table["long"]["PHASE"] == ("Running" if running == long else "Pending")
    active = rows(await cli.run("get", "jobs", "--active", "-o", "wide"))
    assert {r["NAME"] for r in active} == {"long", "huge"} and "REASON" in (await cli.run("get", "jobs", "-o", "wide"))
    queues = {(r["POOL"], r["TEAM"]): r for r in rows(await cli.run("get", "queues"))}
    assert queues[("default", team[waiting])]["PENDING"] == "1"
    assert queues[("default", team[running])]["RUNNING"] == "1"

    described = await cli.run("describe", "job", huge)
    assert f"Job:          {huge}" in described and "Per worker:   GPUs 4" in described
    assert f"Phase:        {'Running' if running == huge else 'Pending'}" in described
    assert "Phase:        Pending" in await cli.run("describe", "job", waiting)

    out = await cli.run("cancel", waiting, "--reason", "asked for too much")
    assert out.strip() == f"job/{waiting} cancelled"
    described = yaml.safe_load(await cli.run("describe", "job", waiting, "-o", "yaml"))
    assert described["phase"] == "JOB_PHASE_CANCELLED" and "asked for too much" in described["reason"]
    assert "Reason:       asked for too much" in await cli.run("describe", "job", waiting)
    # watching a job that did not succeed: its last state, exit status 1
    code, out, _ = await cli.status("watch", waiting)
    assert code == 1 and "Cancelled" in out.splitlines()[-1]
    err = await cli.run("cancel", waiting, ok=False)
    assert "FAILED_PRECONDITION" in err and "Traceback" not in err
    err = await cli.run("describe", "job", "job-none", ok=False)
    assert err.startswith("Error: NOT_FOUND") and "Traceback" not in err


async def test_nodes_cordon_uncordon_and_top(cluster):
    c, cli = cluster
    await c.agent("node-1", "2xA100-80GB", "--label", "rack=r1")
    nodes = {r["NAME"]: r for r in rows(await cli.run("get", "nodes"))}
    assert nodes["node-0"]["GPUS"] == "0/4" and nodes["node-1"]["MODEL"] == "A100-80GB"
    assert "rack=r1" in await cli.run("get", "nodes", "-o", "wide")

    assert (await cli.run("cordon", "node-0", "--reason", "maintenance")).strip() == "node/node-0 cordoned"
    assert {r["NAME"]: r["STATUS"] for r in rows(await cli.run("get", "nodes"))}["node-0"] == "Cordoned"
    # H100s only on the cordoned node: the job waits until it is uncordoned
    out = await cli.run("submit", "--name", "on-h100", "--team", "llm", "--gpus", "3", "--gpu-model", "H100-80GB",
                        "--duration", "600")
    job = out.split()[0].removeprefix("job/")
    assert rows(await cli.run("get", "jobs"))[0]["PHASE"] == "Pending"
    assert (await cli.run("uncordon", "node-0")).strip() == "node/node-0 ready"
    watch = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpusched.cli", "watch", job, env=cli.env, stdout=asyncio.subprocess.PIPE)
    while b"Running" not in (line := await asyncio.wait_for(watch.stdout.readline(), 60)):
        assert line, "watch ended before the job ran"
    watch.terminate()
    await watch.wait()

    top = {r["NODE"]: r for r in rows(await cli.run("top", "nodes"))}
    assert top["node-0"]["GPUS"] == "3/4" and top["node-0"]["GPU%"] == "75%" and top["node-1"]["GPU%"] == "0%"
    assert (await cli.run("describe", "node", "node-0")).count("allocated 1") == 3
    teams = {r["TEAM"]: r for r in rows(await cli.run("top", "teams"))}
    assert teams["llm"]["RUNNING"] == "1" and teams["llm"]["GPUS"] == "3"
    teams = {t["team"]: t for t in json.loads(await cli.run("top", "teams", "-o", "json"))}
    assert teams["llm"]["gpus_allocated"] == 3.0
    # measured use, from the usage records the agent samples (a simulated node's model)
    measured = await cli.run("top", "teams", "--measured", "-o", "json",
                             env={**c.kafka_env("audit"), "GPUSCHED_TOPIC_PREFIX": c.topics.prefix})
    llm = {t["team"]: t for t in json.loads(measured)}["llm"]
    assert llm["gpu_hours_allocated"] > 0 and 0 < llm["gpu_hours_used"] <= llm["gpu_hours_allocated"]
    assert 0 < llm["utilization"] <= 1 and llm["simulated"]
    err = await cli.run("cordon", "node-9", ok=False)
    assert "NOT_FOUND" in err


async def test_json_has_every_field_and_text_escapes_what_a_terminal_would_act_on(cluster):
    _, cli = cluster
    evil = "\x1b]0;owned\x07\x1b[2J\x9b31m"   # retitle the terminal, clear the screen, a C1 CSI
    out = await cli.run("submit", "--name", "evil", "--team", "nlp", "--gpus", "1", "--duration", "600",
                        "--", "sh", "-c", f"echo {evil}")
    job = out.split()[0].removeprefix("job/")
    assert await first_running(cli, job) == job
    [shown] = json.loads(await cli.run("get", "jobs", "-o", "json"))
    worker = shown["workers"][0]
    assert worker["worker"] == 0 and worker["gpus"][0]["index"] == 0      # zeros are there, not left out
    assert shown["spec"]["resources"]["memory_mib"] == 4096                # int64: a number, not "4096"
    assert shown["spec"]["resources"]["gpu_memory_mib"] == 0 and shown["ended_at"] is None
    assert shown["spec"]["command"][2] == f"echo {evil}"                    # JSON carries it as it is
    await cli.run("cancel", job, "--reason", f"stop {evil}")
    for args in (("describe", "job", job), ("get", "jobs", "-o", "wide"), ("watch", job)):
        _, text, _ = await cli.status(*args)   # watch: exit status 1, the job was cancelled
        assert f"job/{job}" in text or job in text, (args, text)
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text, args
    described = await cli.run("describe", "job", job)
    assert "Command:      sh -c echo \\x1b]0;owned\\x07\\x1b[2J\\x9b31m" in described, described
    assert "stop \\x1b]0;owned" in described


async def test_watch_ends_quietly_on_ctrl_c_and_when_its_job_ends(cluster):
    _, cli = cluster
    long = (await cli.run("submit", "--name", "long", "--team", "nlp", "--gpus", "1", "--duration", "600")).split()[0]
    long = long.removeprefix("job/")
    # Ctrl-C as a terminal sends it: SIGINT at its default, even where this run inherited it
    # ignored (a test run started in the background by a shell without job control)
    watch = await asyncio.create_subprocess_exec(sys.executable, "-m", "gpusched.cli", "watch", long, env=cli.env,
                                                 stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert long in (await asyncio.wait_for(watch.stdout.readline(), 60)).decode()   # following the stream now
    watch.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(watch.communicate(), 60)
    assert watch.returncode == 130 and err.decode() == "", err.decode()[-3000:]
    short = (await cli.run("submit", "--name", "short", "--team", "nlp", "--gpus", "1", "--duration", "0.2"))
    code, out, err = await cli.status("watch", short.split()[0].removeprefix("job/"))
    assert code == 0 and "Succeeded" in out.splitlines()[-1] and err == "", err


async def test_a_mig_slice_counts_the_same_in_every_figure(cluster):
    """A 3g slice holds 4 of 8 memory slices but counts its 3 of 7 compute slices: 0.43
    GPU in top nodes, top teams, get queues and describe node alike (a job's usage)."""
    _, cli = cluster
    out = await cli.run("submit", "--name", "sliced", "--team", "vision", "--mig", "3g", "--duration", "600")
    job = out.split()[0].removeprefix("job/")
    assert await first_running(cli, job) == job
    assert rows(await cli.run("top", "nodes"))[0]["GPUS"] == "0.43/4"
    assert {r["TEAM"]: r for r in rows(await cli.run("top", "teams"))}["vision"]["GPUS"] == "0.43"
    assert rows(await cli.run("get", "queues"))[0]["RUNNING GPUS"] == "0.43"
    assert "allocated 0.43, MIG slices 4/8 used" in await cli.run("describe", "node", "node-0")
    assert json.loads(await cli.run("top", "nodes", "-o", "json"))[0]["gpus_allocated"] == 0.428


async def test_policy_commands_set_and_show_quotas(cluster):
    _, cli = cluster
    view = json.loads(await cli.run("policy", "set-quota", "--team", "llm", "--guaranteed", "2", "--limit", "3"))
    assert {(q["team"], q["guaranteed_gpus"], q["limit_gpus"]) for q in view["quotas"]} >= {("llm", 2.0, 3.0)}
    teams = {r["TEAM"]: r for r in rows(await cli.run("top", "teams"))}
    assert teams["llm"]["GUARANTEED"] == "2" and teams["llm"]["LIMIT"] == "3"
    err = await cli.run("policy", "set-team", "llm", "--weight", "0", ok=False)
    assert err.startswith("Error: INVALID_ARGUMENT: weight"), err


async def test_a_config_context_carries_tls_and_a_token_to_a_secured_cluster(kafka_bootstrap, topics, tmp_path):
    """docs/reference/security.md's server (TLS, static tokens, roles); the CLI's credentials from
    a config file's context, or from the options."""
    pki = dev_pki.write(tmp_path / "pki", [{"principal": "alice", "role": "member", "team": "team-a"}])
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs", pki=pki)
    try:
        admission = await cluster.admission()
        await cluster.agent("node-0", "2xA100-80GB")
        (tmp_path / "token").write_text(pki.tokens["alice"] + "\n")
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump({"current-context": "plain", "contexts": {
            "plain": {"endpoint": f"127.0.0.1:{admission.port}"},
            "secure": {"endpoint": f"127.0.0.1:{admission.port}", "ca": str(pki.ca),
                       "token-file": str(tmp_path / "token")}}}))
        cli = Cli(admission.port, tmp_path)
        cli.env.pop("GPUSCHED_ENDPOINT")
        cli.env["GPUSCHED_CONFIG"] = str(config)

        out = await cli.run("--context", "secure", "submit", "--name", "mine", "--gpus", "1")
        job = out.split()[0].removeprefix("job/")
        # the job's team is the token's principal's
        assert yaml.safe_load(await cli.run("--context", "secure", "describe", "job", job, "-o", "yaml")
                              )["spec"]["team"] == "team-a"
        # a member may not cordon; the current context has no TLS and the server wants it
        err = await cli.run("--ca", str(pki.ca), "get", "jobs", ok=False)   # TLS, no token
        assert err.startswith("Error: UNAUTHENTICATED"), err
        err = await cli.run("--context", "secure", "cordon", "node-0", ok=False)
        assert err.startswith("Error: PERMISSION_DENIED"), err
        err = await cli.run("get", "jobs", ok=False)
        assert err.startswith("Error: UNAVAILABLE"), err
        # the same from options, over the config file's endpoint
        out = await cli.run("--ca", str(pki.ca), "--token", pki.tokens["alice"], "get", "jobs", "-o", "json")
        assert [j["job_id"] for j in json.loads(out)] == [job]
    finally:
        await cluster.stop_all()
