"""A Kiln cluster as a store sees it, and the rules of its failover.

Shared by :class:`~kiln_client.DocumentStore` and
:class:`~kiln_client.AsyncDocumentStore`, which do the I/O: this module only decides.

- A store given a list of URLs is in cluster mode: it asks ``GET /cluster`` for the
  leader and sends writes there; reads go to the node it is using (the first URL,
  until that one stops answering). A store given one URL (a string) works as it always
  did, and goes into cluster mode when a server answers a write with a 307
  ``not_leader`` (a follower naming its leader).
- A write that fails because of a failover (the connection is refused or breaks, a
  307 to another node, a 503 ``no_quorum`` or ``not_leader``) is sent again ONCE, as
  it was (same body, same ``If-Match``), to the leader found again. Nothing else is
  retried.
- If the first attempt may have been applied (the request was sent and no answer
  came, or the cluster answered ``no_quorum`` / ``not_leader`` after it could have
  entered the log), the write is resent only when resending cannot apply it twice:
  it is conditional, or it names its document (``PUT``, ``DELETE``, a batch whose
  puts all have ids). Then a refusal of the second attempt that the first one would
  explain (409 conflict, 404 on a delete) is raised as a
  :class:`~kiln_client.errors.RetriedWriteError` saying the first attempt may have
  been applied. A write that makes the server generate an id is not resent:
  :class:`~kiln_client.errors.WriteOutcomeUnknownError`.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import unquote, urlsplit

import httpx

from .errors import (ConnectionFailedError, KilnError, NoQuorumError, NotFoundError,
                     RetryConflictError, RetryNotFoundError, WriteOutcomeUnknownError,
                     error_from_response)

#: Seconds between two rounds of ``GET /cluster`` while no node says it leads.
PROBE_INTERVAL = 0.05


def normalize_urls(urls: Union[str, Sequence[str]]) -> Tuple[List[str], bool]:
    """``(the URLs without a trailing slash, whether the store is in cluster mode)``:
    a list (even of one URL) asks for cluster mode, a string does not."""
    if isinstance(urls, str):
        given, clustered = [urls], False
    else:
        given, clustered = list(urls), True
        if not given:
            raise ValueError("no URL given")
    out: List[str] = []
    for u in given:
        if not isinstance(u, str):
            raise TypeError(f"a URL is a str, not {type(u)!r}")
        u = u.rstrip("/")
        if urlsplit(u).scheme not in ("http", "https"):
            raise ValueError(f"url must start with http:// or https://, not {u!r}")
        if u not in out:
            out.append(u)
    if len({urlsplit(u).scheme for u in out}) > 1:
        raise ValueError(f"the URLs mix http and https: {out}")
    return out, clustered


def is_write(method: str, path: str) -> bool:
    """Whether a request is one only the leader takes (as the server decides it:
    PUT/POST/PATCH/DELETE, except queries and the cluster's own routes)."""
    p = path.split("?", 1)[0]
    return (method.upper() in ("PUT", "POST", "PATCH", "DELETE") and not p.startswith("/cluster")
            and not p.endswith("/queries"))


def resend_cannot_duplicate(method: str, path: str, content: Optional[bytes]) -> bool:
    """Whether sending a write a second time cannot apply it twice: a conditional
    write fails its condition if the first one landed; a PUT or DELETE of a named
    document (or database) writes the same thing again. A write that makes the server
    generate an id would make a second document."""
    m = method.upper()
    p = path.split("?", 1)[0]
    # A merge patch applied twice leaves what it left once (RFC 7396 is idempotent).
    if m in ("DELETE", "PATCH"):
        return True
    if m == "PUT":
        return not p.endswith("/")
    if m == "POST" and p.endswith("/batch"):
        try:
            ops = json.loads(content or b"{}").get("ops")
        except (ValueError, AttributeError):
            return False
        if not isinstance(ops, list):
            return False
        for op in ops:
            if not isinstance(op, dict):
                return False
            doc_id = op.get("id")
            if op.get("op") == "put" and (not isinstance(doc_id, str) or doc_id.endswith("/")):
                return False
        return True
    return False


@dataclass
class Failover:
    """Why a write's attempt failed because of a failover."""

    #: The node the attempt went to.
    node: str
    #: The error to raise if the write is not retried (``node`` set).
    error: KilnError
    #: Whether the attempt may have been applied (False: it certainly was not).
    maybe_applied: bool
    #: The leader the answer named (a 307's ``Location``, as a node URL), if any.
    hint: Optional[str] = None

    def describe(self) -> str:
        return f"{self.error} (from {self.node})"


def failover_of_answer(node: str, status: int, content: bytes,
                       headers: Mapping[str, str], view: "ClusterView") -> Optional[Failover]:
    """The failover an answer reports (a 307 ``not_leader``; a 503 ``no_quorum`` or
    ``not_leader``), or None for any other answer."""
    if status == 307:
        err = error_from_response(status, content, headers)
        if err.code != "not_leader" and not headers.get("location"):
            return None
        err.node = node
        # A follower's front door redirects before anything reaches the log.
        return Failover(node, err, False, view.url_of_location(headers.get("location")))
    if status == 503:
        err = error_from_response(status, content, headers)
        if err.code not in ("no_quorum", "not_leader"):
            return None
        err.node = node
        # A 503 no_quorum is certain only when the write never entered a log: no leader
        # (a follower's front door), or a leader that refused it up front. After a
        # timeout or a lost leadership it may still be committed. The server says
        # which in "outcome"; from one that does not, read the message (a change of
        # wording only makes this more careful).
        outcome = err.body.get("outcome")
        if outcome is not None:
            certain = outcome == "not_written"
        else:
            text = err.message
            certain = err.code == "no_quorum" and (
                "has no leader" in text or "within 0 ms" in text)
        return Failover(node, err, not certain)
    return None


def failover_of_transport(node: str, method: str, path: str, exc: Exception) -> Failover:
    """A broken or refused connection as a failover: a refused one was never sent."""
    err = ConnectionFailedError(f"{method} {node}{path}: {exc!r}")
    err.node = node
    not_sent = isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
    return Failover(node, err, not not_sent)


def not_retried(method: str, path: str, first: Failover) -> KilnError:
    """The error for a write whose first attempt may have been applied and that is not
    resent (it would make the server generate a second id)."""
    err = WriteOutcomeUnknownError(
        f"{method} {path}: the write failed during a failover after it was sent "
        f"({first.describe()}): it may or may not have been applied, and it was not "
        "sent again because a second attempt would create a second document (the "
        "server generates its id). Look for it before writing it again.",
        cause=first.error)
    err.node = first.node
    return err


def after_retry(method: str, path: str, headers: Optional[Mapping[str, str]],
                first: Failover, node: str, err: KilnError) -> KilnError:
    """The error to raise for the refused second attempt of a write: a
    :class:`RetriedWriteError` when the first attempt may have been applied and would
    explain the refusal, else the server's error (naming the first failure)."""
    err.node = node
    explained = err.status in (409, 412) or (
        err.status == 404 and (method.upper() == "DELETE" or err.code == "document_not_found"))
    if not first.maybe_applied or not explained:
        err.message = f"{err.message} (a retry after: {first.describe()})"
        return err
    message = (f"{method} {path}: the first attempt failed during a failover "
               f"({first.describe()}); it was sent again once, unchanged, to {node}, "
               f"which refused it: {err.code}: {err.message}. The first attempt may "
               "have been applied: read the document again before deciding what to do.")
    out: KilnError
    if err.status == 404:
        out = RetryNotFoundError(message, code=err.code, status=err.status, body=err.body)
    else:
        if_match = None
        for k, v in (headers or {}).items():
            if k.lower() == "if-match":
                if_match = v.strip().strip('"')
        doc_id = getattr(err, "id", None) or _doc_id_of(path)
        out = RetryConflictError(message, id=doc_id, expected_etag=if_match,
                                 current_etag=getattr(err, "current_etag", None),
                                 code=err.code, status=err.status, body=err.body)
    out.first_error = first.error
    out.retry_error = err
    out.node = node
    return out


def _doc_id_of(path: str) -> Optional[str]:
    p = path.split("?", 1)[0]
    parts = p.split("/docs/", 1)
    return unquote(parts[1]) if len(parts) == 2 and p.startswith("/dbs/") else None


def _heard_from_majority(status: Mapping[str, Any]) -> bool:
    """Whether a leader's ``GET /cluster`` shows it has replicated to a majority (its
    members' ``applied`` are known): a leader elected a moment ago has not yet, and
    refuses writes (``no_quorum``) until it has. Without the members' figures, yes."""
    members = [m for m in status.get("members") or [] if isinstance(m, dict)]
    if not members or not all("applied" in m for m in members):
        return True
    known = sum(1 for m in members if m.get("applied") is not None)
    return known * 2 > len(members)


class ClusterView:
    """The nodes a store knows and which of them it uses (thread-safe for reading;
    the stores change it under their own discovery lock)."""

    def __init__(self, urls: List[str], clustered: bool) -> None:
        #: The URLs the store was given, in order.
        self.urls = list(urls)
        self.scheme = urlsplit(urls[0]).scheme
        #: Whether the store treats its servers as a cluster (writes to the leader,
        #: failover). False for one URL given as a string until a 307 says otherwise.
        self.clustered = clustered
        #: The node reads go to.
        self.current = urls[0]
        #: The leader writes go to (None: not known, or not a cluster).
        self.leader: Optional[str] = None
        #: Node URLs named by ``GET /cluster`` that the store was not given.
        self.learned: List[str] = []
        #: Node id -> the URL the store reaches it at (the first URL that answered
        #: ``GET /cluster`` as that node: the given URLs come first).
        self.by_id: Dict[int, str] = {}
        self.lock = threading.Lock()

    def url_of_address(self, address: str) -> str:
        """The URL of a node at ``host:port`` (as in ``--cluster``)."""
        return f"{self.scheme}://{address}"

    def url_of_location(self, location: Optional[str]) -> Optional[str]:
        """The node a 307's ``Location`` names (the server writes ``http://``; the
        store keeps its own scheme)."""
        if not location:
            return None
        parts = urlsplit(location)
        if not parts.netloc:
            return None
        return self.url_of_address(parts.netloc)

    def nodes(self) -> List[str]:
        """Every node URL known: the given ones, then the learned ones."""
        return self.urls + [u for u in self.learned if u not in self.urls]

    def probe_order(self, hint: Optional[str] = None) -> List[str]:
        order: List[str] = []
        for u in ([hint] if hint else []) + [self.current] + self.nodes():
            if u not in order:
                order.append(u)
        return order

    def absorb(self, url: str, status: Mapping[str, Any]) -> Optional[Tuple[int, str]]:
        """Records what ``GET /cluster`` at ``url`` answered; ``(term, url)`` when that
        node says it is the leader."""
        node_id = status.get("node_id")
        if isinstance(node_id, int):
            self.by_id.setdefault(node_id, url)
        for m in status.get("members") or []:
            if not isinstance(m, dict) or not isinstance(m.get("address"), str):
                continue
            mid = m.get("id")
            known = self.by_id.get(mid) if isinstance(mid, int) else None
            u = known or self.url_of_address(m["address"])
            if u not in self.urls and u not in self.learned:
                self.learned.append(u)
        term = status.get("term")
        if (status.get("state") == "leader" and node_id is not None
                and status.get("leader") == node_id and _heard_from_majority(status)):
            return (term if isinstance(term, int) else 0, url)
        return None

    @staticmethod
    def choose(claims: List[Tuple[int, str]]) -> str:
        """The leader among the nodes that say they lead: the one of the highest term
        (an old leader cut off from the others may not know it was replaced)."""
        best = max(t for t, _ in claims)
        return next(u for t, u in claims if t == best)

    def next_read_nodes(self, failed: str) -> List[str]:
        """The other nodes to read from after ``failed`` did not answer, in order."""
        nodes = self.nodes()
        if failed in nodes:
            i = nodes.index(failed)
            nodes = nodes[i + 1:] + nodes[:i]
        return [u for u in nodes if u != failed]


def no_leader_error(view: ClusterView, answered: List[str], waited: float) -> KilnError:
    """The error when no node said it leads within the failover timeout."""
    if not answered:
        err: KilnError = ConnectionFailedError(
            f"no node of the cluster answered GET /cluster within {waited:g} s "
            f"(asked: {', '.join(view.nodes())})")
    else:
        err = NoQuorumError(
            f"no node said it leads the cluster within {waited:g} s (asked: "
            f"{', '.join(view.nodes())}; answered: {', '.join(dict.fromkeys(answered))})")
    err.node = answered[-1] if answered else None
    return err


def is_not_clustered(status: int, content: bytes) -> bool:
    """``GET /cluster`` answered by a server that is not in a cluster (or predates
    clusters: no such route)."""
    if status != 404:
        return False
    err = error_from_response(status, content)
    return isinstance(err, NotFoundError)


def probe_refused(url: str, r: httpx.Response) -> Optional[KilnError]:
    """The error to raise at once for an answer to ``GET /cluster`` that waiting
    would not change (a 401 for a missing API key, another 4xx); None to go on."""
    if 400 <= r.status_code < 500 and r.status_code not in (404, 408, 429):
        err = error_from_response(r.status_code, r.content, r.headers)
        err.node = url
        return err
    return None


__all__ = ["ClusterView", "Failover", "is_write", "resend_cannot_duplicate",
           "normalize_urls"]
