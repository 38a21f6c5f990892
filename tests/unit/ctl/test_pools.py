"""``gpusched pool topology`` and ``describe pool`` (gpusched/ctl/pools.py)."""
from __future__ import annotations

from click.testing import CliRunner

from gpusched.cli import cli
from gpusched.ctl import pools
from gpusched.v1 import cluster_pb2


def test_pool_topology_sends_the_levels_top_down_and_an_empty_list_resets(monkeypatch):
    sent = []

    def set_pool_topology(self, pool, levels):
        sent.append((pool, list(levels)))
        return cluster_pb2.PoolSummary(pool=pool, topology_levels=levels or ["spine", "rack"])

    monkeypatch.setattr(pools.SyncClient, "set_pool_topology", set_pool_topology)
    out = CliRunner().invoke(cli, ["pool", "topology", "default", "--levels", "spine, rack,block"])
    assert out.exit_code == 0, out.output
    assert out.output.strip() == "pool/default topology spine,rack,block"
    out = CliRunner().invoke(cli, ["pool", "topology", "gpu-a", "--levels", ""])
    assert out.exit_code == 0 and out.output.strip() == "pool/gpu-a topology spine,rack"
    assert sent == [("default", ["spine", "rack", "block"]), ("gpu-a", [])]


def test_describe_pool_shows_its_levels_and_time_limits(monkeypatch):
    summary = cluster_pb2.PoolSummary(pool="default", nodes=2, gpus=16, gpu_milli_allocated=4000,
                                      topology_levels=["spine", "rack", "block"])
    summary.max_time_limit.FromSeconds(3600)
    monkeypatch.setattr(pools.SyncClient, "summary", lambda self, pool: summary)
    out = CliRunner().invoke(cli, ["describe", "pool"])
    assert out.exit_code == 0, out.output
    assert "Topology:     spine > rack > block" in out.output and "Time limits:  max 3600s" in out.output
    assert "GPUs:         4/16 allocated" in out.output
