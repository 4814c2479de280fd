"""Cluster mode against three real `kiln serve --node-id N --cluster ...` processes on
free loopback ports (temporary data directories, one cluster per test): writes sent
through a follower land on the leader, the client goes on writing after a kill -9 of
the leader, and the retry-once rule, with a TCP proxy in front of the leader that
loses a request or its answer."""

from __future__ import annotations

import asyncio
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
import uuid
from typing import Dict, Iterator, List, Optional, Tuple

import httpx
import pytest

from conftest import KilnServer, free_port, kiln_bin
from kiln_client import (AsyncDocumentStore, ConcurrencyError, ConnectionFailedError,
                         DocumentStore, NoQuorumError, RetryConflictError,
                         RetryNotFoundError, WriteOutcomeUnknownError)
from kiln_client.cluster import ClusterView, is_write, resend_cannot_duplicate


class Cluster:
    """Three `kiln serve` nodes of one cluster."""

    def __init__(self, n: int = 3) -> None:
        out = subprocess.run([kiln_bin(), "serve", "--help"], capture_output=True,
                             text=True).stdout
        if "--cluster" not in out:
            pytest.fail(f"{kiln_bin()} has no --cluster: rebuild it (cargo build -p kiln-cli)")
        ports = [free_port() for _ in range(n)]
        spec = ",".join(f"{i + 1}=127.0.0.1:{p}" for i, p in enumerate(ports))
        self.nodes: List[KilnServer] = []
        try:
            for i, p in enumerate(ports):
                self.nodes.append(KilnServer(port=p, extra=[
                    "--node-id", str(i + 1), "--cluster", spec, "--journal-file-size-mib", "4"]))
        except BaseException:
            self.stop()
            raise

    def status(self, node: KilnServer) -> Optional[Dict]:
        try:
            r = httpx.get(f"{node.url}/cluster", timeout=1)
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None

    def wait_leader(self, timeout: float = 10.0,
                    not_: Optional[KilnServer] = None) -> KilnServer:
        """The leader, once every running node names the same running node as it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            alive = [n for n in self.nodes if n.proc is not None]
            seen = {(s or {}).get("leader") for s in map(self.status, alive)}
            if len(seen) == 1:
                leader_id = seen.pop()
                if leader_id is not None and self.nodes[leader_id - 1] in alive \
                        and self.nodes[leader_id - 1] is not not_:
                    return self.nodes[leader_id - 1]
            time.sleep(0.05)
        raise AssertionError(f"no leader within {timeout} s: "
                             f"{[self.status(n) for n in self.nodes]}")

    def sigkill(self, node: KilnServer) -> None:
        """kill -9, as a crash would."""
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGKILL)
        node.proc.wait(10)
        node.proc = None

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()
            shutil.rmtree(n.data_dir, ignore_errors=True)


@pytest.fixture()
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    yield c
    c.stop()


@pytest.fixture()
def db() -> str:
    return "c" + uuid.uuid4().hex[:10]


def doc_on(node: KilnServer, db: str, doc_id: str) -> Optional[Tuple[Dict, str]]:
    r = httpx.get(f"{node.url}/dbs/{db}/docs/{doc_id}", timeout=5)
    if r.status_code == 404:
        return None
    r.raise_for_status()
    return r.json(), r.headers["etag"].strip('"')


def wait_doc_on(node: KilnServer, db: str, doc_id: str, etag: str,
                timeout: float = 5.0) -> Dict:
    """The document on a node once it has the write of that etag (a follower lags)."""
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        got = doc_on(node, db, doc_id)
        if got is not None and got[1] == etag:
            return got[0]
        time.sleep(0.02)
    raise AssertionError(f"{node.url} has {doc_id} as {got}, not at etag {etag}")


# --- the rules, without a server ----------------------------------------------------------


def test_which_writes_can_be_resent() -> None:
    assert is_write("PUT", "/dbs/a/docs/x/1") and is_write("POST", "/dbs/a/batch")
    assert is_write("DELETE", "/dbs/a") and not is_write("GET", "/dbs/a/docs/x/1")
    assert not is_write("POST", "/dbs/a/queries") and not is_write("POST", "/cluster/raft/vote")
    assert resend_cannot_duplicate("PUT", "/dbs/a/docs/users/ada", b"{}")
    assert resend_cannot_duplicate("DELETE", "/dbs/a/docs/users/ada", None)
    assert resend_cannot_duplicate("PUT", "/dbs/a", None)
    # The server generates the id: a second attempt would make a second document.
    assert not resend_cannot_duplicate("POST", "/dbs/a/docs/users/", b"{}")
    assert not resend_cannot_duplicate("PUT", "/dbs/a/docs/users/", b"{}")
    named = {"ops": [{"op": "put", "id": "u/1", "document": {}}, {"op": "delete", "id": "u/2"}]}
    assert resend_cannot_duplicate("POST", "/dbs/a/batch", json.dumps(named).encode())
    generated = {"ops": [{"op": "put", "id": "u/", "document": {}}]}
    assert not resend_cannot_duplicate("POST", "/dbs/a/batch", json.dumps(generated).encode())
    assert not resend_cannot_duplicate("POST", "/dbs/a/bulk", b"")


def test_leader_claims() -> None:
    view = ClusterView(["http://127.0.0.1:1", "http://127.0.0.1:2"], True)

    def status(node_id: int, state: str, leader: int, term: int, applied: List) -> Dict:
        return {"node_id": node_id, "leader": leader, "term": term, "state": state,
                "members": [{"id": i + 1, "address": f"127.0.0.1:{i + 1}", "applied": a}
                            for i, a in enumerate(applied)]}

    # A follower naming a leader is no claim; a leader that has not yet heard from a
    # majority (elected a moment ago) is not taken yet.
    assert view.absorb("http://127.0.0.1:2", status(2, "follower", 1, 3, [5, 5, 5])) is None
    assert view.absorb("http://127.0.0.1:1", status(1, "leader", 1, 3, [5, None, None])) is None
    assert view.absorb("http://127.0.0.1:1", status(1, "leader", 1, 3, [5, 4, None])) == \
        (3, "http://127.0.0.1:1")
    # A third member was learned from the members' addresses.
    assert view.nodes() == ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"]
    # An old leader cut off from the others loses to the one of a later term.
    assert view.choose([(3, "http://127.0.0.1:1"), (4, "http://127.0.0.1:3")]) == \
        "http://127.0.0.1:3"


def test_single_url_keeps_its_old_form() -> None:
    st = DocumentStore("http://127.0.0.1:1/", "d")
    assert st.url == "http://127.0.0.1:1" and st.urls == [st.url] and not st.clustered
    assert st.last_node is None and st.leader_url is None
    st.close()
    st = DocumentStore(["http://127.0.0.1:1", "http://127.0.0.1:2/"], "d")
    assert st.clustered and st.urls == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    st.close()
    with pytest.raises(ValueError):
        DocumentStore(["http://a:1", "https://b:2"], "d")
    with pytest.raises(ValueError):
        DocumentStore([], "d")


# --- a real cluster ------------------------------------------------------------------------


def test_writes_through_a_follower_land_on_the_leader(cluster: Cluster, db: str) -> None:
    leader = cluster.wait_leader()
    follower = next(n for n in cluster.nodes if n is not leader)

    # A list of URLs (here only a follower's): the store asks it for the leader.
    with DocumentStore([follower.url], db) as st:
        st.create_database()
        assert st.last_node == leader.url and st.leader_url == leader.url
        etag = st.put("users/ada", {"name": "Ada"})
        assert st.last_node == leader.url
        with st.session() as s:
            s.store({"name": "Bob"}, "users/bob")
            s.save_changes()
            assert s.requests == 1
        assert st.last_node == leader.url
        # Reads go to the node the store uses (the follower), with the leader's etag.
        for n in cluster.nodes:
            assert wait_doc_on(n, db, "users/ada", etag)["name"] == "Ada"
        assert st.get("users/ada")["name"] == "Ada"
        assert st.last_node == follower.url
        r = st.cached_request("GET", st.doc_path("users/ada"))
        assert r.node == follower.url and r.from_cache == "304" and r.etag == etag

    # One URL as a string (the old form): the follower's 307 names the leader, the
    # write is sent there once, and the store is in cluster mode from then on.
    with DocumentStore(follower.url, db) as st:
        assert not st.clustered
        etag2 = st.put("users/cy", {"name": "Cy"})
        assert st.clustered and st.last_node == leader.url
        body, etag_on_leader = doc_on(leader, db, "users/cy")
        assert body["name"] == "Cy" and etag_on_leader == etag2
        st.delete("users/cy")
        assert st.last_node == leader.url and doc_on(leader, db, "users/cy") is None

    # Every write was applied once: the database's sequence counts them.
    stats = httpx.get(f"{leader.url}/dbs/{db}").json()
    assert stats["documents"] == 2, stats


def test_async_store_writes_to_the_leader(cluster: Cluster, db: str) -> None:
    leader = cluster.wait_leader()
    follower = next(n for n in cluster.nodes if n is not leader)

    async def main() -> None:
        async with AsyncDocumentStore([follower.url], db) as st:
            await st.create_database()
            etag = await st.put("a/1", {"v": 1})
            assert st.last_node == leader.url
            async with st.session() as s:
                s.store({"v": 2}, "a/2")
                await s.save_changes()
            assert st.last_node == leader.url
            wait_doc_on(follower, db, "a/1", etag)
            assert (await st.get("a/1"))["v"] == 1
            assert st.last_node == follower.url

    asyncio.run(main())


def test_client_goes_on_writing_after_the_leader_is_killed(cluster: Cluster, db: str) -> None:
    leader = cluster.wait_leader()
    others = [n for n in cluster.nodes if n is not leader]
    # The leader first: reads and the changes feed start on it and must move on.
    st = DocumentStore([leader.url] + [n.url for n in others], db)
    st.create_database()
    changes = st.changes()
    sub = changes.for_prefix("w/")
    assert sub.wait_subscribed(5)

    acked: Dict[str, str] = {}
    nodes: Dict[str, str] = {}
    failures: List[BaseException] = []
    stop = threading.Event()

    def writer() -> None:
        i = 0
        try:
            while not stop.is_set():
                doc_id = f"w/{i}"
                acked[doc_id] = st.put(doc_id, {"i": i})
                nodes[doc_id] = st.last_node or ""
                i += 1
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            failures.append(e)

    t = threading.Thread(target=writer)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while len(acked) < 20 and not failures and time.monotonic() < deadline:
            time.sleep(0.005)
        cluster.sigkill(leader)  # mid-way: the writer is sending
        killed_at = len(acked)
        t_kill = time.monotonic()
        deadline = time.monotonic() + 15
        while len(acked) < killed_at + 20 and not failures and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        t.join(30)
    assert not failures, f"a write failed: {failures[0]!r}"
    assert len(acked) >= killed_at + 20, "the writes did not go on after the kill"
    # The write in flight at the kill, or the next one, failed over: sent again once.
    assert st.stats.failover_retries >= 1
    print(f"kill at write {killed_at}, {len(acked)} acked, {st.stats.failover_retries} retried, "
          f"{time.monotonic() - t_kill:.2f} s from the kill to the 20th write after it")

    new_leader = cluster.wait_leader()
    assert new_leader is not leader and st.leader_url == new_leader.url
    last = f"w/{len(acked) - 1}"
    assert nodes[last] == new_leader.url and nodes["w/0"] == leader.url
    # Every acknowledged write is on both surviving nodes with the etag it was given.
    for n in others:
        for doc_id, etag in acked.items():
            wait_doc_on(n, db, doc_id, etag)
    # Reads moved off the dead node; the changes feed reconnected to another node
    # and resumed there (every node gives a change the same etag).
    assert st.get("w/0") is not None and st.last_node in {n.url for n in others}
    assert st.url != leader.url
    deadline = time.monotonic() + 10
    seen = set()
    while last not in seen and time.monotonic() < deadline:
        c = sub.next(timeout=0.5)
        if c is not None:
            seen.add(c.id)
    assert last in seen, f"the feed did not resume: {changes.last_close}"
    changes.close()
    st.close()


def test_a_subscription_worker_follows_the_leader(cluster: Cluster, db: str) -> None:
    """A worker started with the follower first finds the leader; when the leader is
    killed it reconnects to the new one and resumes after its last acknowledged
    batch: every document is delivered, at least once, in etag order."""
    leader = cluster.wait_leader()
    others = [n for n in cluster.nodes if n is not leader]
    st = DocumentStore([n.url for n in others] + [leader.url], db)
    st.create_database()
    st.create_subscription("all", "from items")
    for i in range(30):
        st.put(f"items/{i}", {"i": i})
    sub = st.subscription("all")
    seen: List[str] = []
    etags: List[int] = []
    killed = threading.Event()

    def handle(batch) -> None:  # type: ignore[no-untyped-def]
        for d in batch:
            seen.append(d["@metadata"]["@id"])
            etags.append(int(d["@metadata"]["@etag"].split("-")[0]))
        if not killed.is_set():
            killed.set()
            # The first batch is acknowledged after the leader is gone: the new
            # leader sends it again (at least once), then the rest.
            cluster.sigkill(leader)

    done = threading.Event()

    def worker() -> None:
        sub.run(handle, batch_size=10)
        done.set()

    t = threading.Thread(target=worker)
    t.start()
    try:
        assert killed.wait(15), "no batch came"
        cluster.wait_leader(timeout=15)
        for i in range(30, 45):
            st.put(f"items/{i}", {"i": i})
        deadline = time.monotonic() + 20
        while len(set(seen)) < 45 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sub.stop()
        t.join(10)
    assert set(seen) == {f"items/{i}" for i in range(45)}, sorted(set(seen))
    assert sub.connections >= 2
    # After the reconnection the batches start again at the position (the first
    # batch was never acknowledged), in etag order from there.
    restart = etags.index(etags[0], 1)
    assert etags[restart:] == sorted(etags[restart:]) and len(set(etags[restart:])) == 45
    assert st.subscriptions()[0]["position"] is not None
    st.close()


def test_no_quorum_is_retried_once_then_reported(cluster: Cluster, db: str) -> None:
    leader = cluster.wait_leader()
    st = DocumentStore([n.url for n in cluster.nodes], db)
    try:
        st.create_database()
        etag = st.put("a/1", {"v": 1})
        for n in cluster.nodes:
            if n is not leader:
                cluster.sigkill(n)
        # The leader notices within an election timeout (0.8 s) that no majority
        # answers it, and from then on refuses writes before they enter its log.
        time.sleep(1.5)
        retried = st.stats.failover_retries
        with pytest.raises(NoQuorumError) as info:
            st.put("a/1", {"v": 2}, if_match=etag)
        assert "a retry after" in str(info.value) and info.value.node == leader.url
        # Refused up front, before the leader's log: the answer says it surely did
        # not happen.
        assert info.value.outcome == "not_written"
        assert st.stats.failover_retries == retried + 1
        # Refused before it entered the log, a write that generates an id is certain
        # not to have been applied: it is sent again too (and refused again).
        with pytest.raises(NoQuorumError):
            st.request("POST", f"/dbs/{db}/docs/gen/", json_body={"v": 1})
        assert st.stats.failover_retries == retried + 2
        assert doc_on(leader, db, "a/1")[1] == etag
    finally:
        st.close()


class FaultyProxy:
    """A TCP proxy in front of one node that can lose a request (the connection is
    reset before it is forwarded) or its answer (forwarded, then the connection is
    reset when the answer comes: the write was applied, the client never hears it)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.faults: List[Tuple[str, bytes]] = []
        #: The request line of every request seen.
        self.requests: List[str] = []
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def lose(self, what: str, method: str, path: str, times: int = 1) -> None:
        """``what`` is "request" or "answer"."""
        with self.lock:
            self.faults += [(what, f"{method} {path}".encode())] * times

    def count(self, method: str, path: str) -> int:
        with self.lock:
            return sum(1 for r in self.requests if r.startswith(f"{method} {path}"))

    def _accept(self) -> None:
        while not self.closed:
            try:
                c, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _fault(self, data: bytes) -> Optional[str]:
        line = data.split(b"\r\n", 1)[0]
        if not line.split(b" ", 1)[0] in (b"GET", b"PUT", b"POST", b"DELETE", b"HEAD"):
            return None  # the rest of a body
        with self.lock:
            self.requests.append(line.decode("latin-1"))
            for i, (what, prefix) in enumerate(self.faults):
                if line.startswith(prefix):
                    del self.faults[i]
                    return what
        return None

    @staticmethod
    def _reset(s: socket.socket) -> None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()

    def _serve(self, c: socket.socket) -> None:
        up = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10)
        lose_answer = False
        try:
            while not self.closed:
                ready, _, _ = select.select([c, up], [], [], 0.2)
                for s in ready:
                    data = s.recv(1 << 16)
                    if not data:
                        return
                    if s is c:
                        what = self._fault(data)
                        if what == "request":
                            self._reset(c)
                            return
                        lose_answer = lose_answer or what == "answer"
                        up.sendall(data)
                    elif lose_answer:
                        self._reset(c)
                        return
                    else:
                        c.sendall(data)
        except OSError:
            pass
        finally:
            for s in (c, up):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self.closed = True
        self.listener.close()


def test_a_write_is_retried_once_and_a_conflicting_retry_is_reported(cluster: Cluster,
                                                                      db: str) -> None:
    leader = cluster.wait_leader()
    proxy = FaultyProxy(leader.port)
    # The proxy first: the store reaches the leader through it (it answers GET
    # /cluster as the leader's node id).
    st = DocumentStore([proxy.url] + [n.url for n in cluster.nodes if n is not leader], db)
    try:
        st.create_database()
        assert st.leader_url == proxy.url
        path = f"/dbs/{db}/docs/a/1"
        e1 = st.put("a/1", {"v": 1})

        # The request is lost (the connection breaks before the leader gets it): sent
        # again once, with the same If-Match, and it succeeds.
        proxy.lose("request", "PUT", path)
        e2 = st.put("a/1", {"v": 2}, if_match=e1)
        assert proxy.count("PUT", path) == 3 and st.last_node == proxy.url
        body, etag = doc_on(leader, db, "a/1")
        assert body["v"] == 2 and etag == e2

        # The answer is lost (the leader applied the write): the one retry, with the
        # same If-Match, is refused with a conflict, reported as such.
        proxy.lose("answer", "PUT", path)
        with pytest.raises(RetryConflictError) as info:
            st.put("a/1", {"v": 3}, if_match=e2)
        e = info.value
        assert isinstance(e, ConcurrencyError) and e.status == 409 and e.code == "conflict"
        assert "first attempt may have been applied" in str(e)
        assert isinstance(e.first_error, ConnectionFailedError)
        assert e.id == "a/1" and e.expected_etag == e2
        body, e3 = doc_on(leader, db, "a/1")
        assert body["v"] == 3 and e.current_etag == e3  # applied once, by the first attempt
        assert proxy.count("PUT", path) == 5

        # Exactly once: a write whose retry fails too is not sent a third time.
        proxy.lose("request", "PUT", path, times=2)
        with pytest.raises(ConnectionFailedError) as info2:
            st.put("a/1", {"v": 4}, if_match=e3)
        assert "the one retry" in str(info2.value)
        assert proxy.count("PUT", path) == 7 and doc_on(leader, db, "a/1")[1] == e3

        # Other errors are not retried: a plain conflict is sent once.
        with pytest.raises(ConcurrencyError) as info5:
            st.put("a/1", {"v": 4}, if_match=e1)
        assert not isinstance(info5.value, RetryConflictError)
        assert proxy.count("PUT", path) == 8 and info5.value.node == proxy.url

        # A delete whose answer is lost: the retry finds nothing to delete.
        proxy.lose("answer", "DELETE", path)
        with pytest.raises(RetryNotFoundError) as info3:
            st.delete("a/1")
        assert "may have been applied" in str(info3.value) and doc_on(leader, db, "a/1") is None

        # A session's batch whose answer is lost: the conflict names the document and
        # both etags, and says the whole batch may have been written.
        st.put("b/1", {"v": 1})
        with st.session() as s:
            b = s.load("b/1")
            loaded = s.etag_of(b)
            b["v"] = 2
            proxy.lose("answer", "POST", f"/dbs/{db}/batch")
            with pytest.raises(RetryConflictError) as info4:
                s.save_changes()
        e = info4.value
        assert e.id == "b/1" and e.expected_etag == loaded
        assert e.current_etag == doc_on(leader, db, "b/1")[1]
        assert "whole batch" in str(e)

        # A write that makes the server generate an id is never sent twice: a lost
        # answer leaves its outcome unknown.
        proxy.lose("answer", "POST", f"/dbs/{db}/docs/gen/")
        with pytest.raises(WriteOutcomeUnknownError):
            st.request("POST", f"/dbs/{db}/docs/gen/", json_body={"v": 1})
        assert proxy.count("POST", f"/dbs/{db}/docs/gen/") == 1
        # ...and the store has found its leader again for the next write.
        st.put("c/1", {"v": 1})
        assert st.last_node == proxy.url
    finally:
        st.close()
        proxy.close()

