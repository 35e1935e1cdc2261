"""The launch scripts on real network stacks: a Ray cluster over three netns hosts
(tests/netns_cluster.py), head on host 1, workers on hosts 2 and 3, token authentication; each
node runs its tasks on its own address, with its own /tmp and Ray session directory."""

from __future__ import annotations

import json
import time

import pytest

from netns_cluster import WHERE, start_cluster
from netns_hosts import hosts_fixture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hosts():
    yield from hosts_fixture(3)


@pytest.fixture(scope="module")
def cluster(hosts, tmp_path_factory):
    t0 = time.monotonic()
    c = start_cluster(hosts, {}, {1: 1, 2: 1, 3: 1}, tmp_path_factory.mktemp("operator"))
    print(f"3 hosts, head + 2 workers up in {time.monotonic() - t0:.0f} s")
    yield c
    c.stop()


def test_every_node_runs_on_its_own_host_address_tmp_and_session(hosts, cluster):
    r = cluster.driver(2, WHERE)  # a driver on a worker host: it finds the cluster through its own node
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    where = json.loads(r.stdout.split("WHERE ", 1)[1])
    assert sorted(where) == ["host1", "host2", "host3"], where
    for i in (1, 2, 3):
        w = where[f"host{i}"]
        assert w["node_ip"] == hosts.addr(i) and w["home"] == str(hosts.home(i)), w
        assert w["session"].startswith("/tmp/ray/session_"), w
        assert (hosts.state / f"h{i}" / "tmp" / w["session"].removeprefix("/tmp/")).is_dir()  # its own /tmp
    assert "note: with a node address other than 127.0.0.1" in cluster.out[1]


def test_a_driver_without_the_token_is_refused(hosts, cluster):
    (hosts.home(3) / ".ray" / "auth_token").rename(hosts.home(3) / ".ray" / "auth_token.away")
    try:
        r = cluster.driver(3, "import ray; ray.init(address='auto'); print('JOINED')", timeout=120)
        assert r.returncode != 0 and "JOINED" not in r.stdout, r.stdout[-2000:]
    finally:
        (hosts.home(3) / ".ray" / "auth_token.away").rename(hosts.home(3) / ".ray" / "auth_token")
