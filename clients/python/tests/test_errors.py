"""Every error code the server can send maps to its own exception class (read from the
server's source), and real error answers arrive as those classes with the server's
message."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

import kiln_client.errors as E
from conftest import REPO
from kiln_client import DocumentStore

SERVER_SRC = REPO / "crates" / "kiln-server" / "src"

_PATTERNS = [
    # The server's one list of codes: `Variant = "code" => STATUS,` in error.rs.
    r'(?m)^\s*\w+ = "([a-z_]+)" =>',
    # The changes feed's WebSocket messages and the bulk stream's in-band errors.
    r'code:\s*"([a-z_]+)"',
    r'send_error\(\s*"([a-z_]+)"',
    r'\bbad\(\s*"([a-z_]+)"',
    r'\.stop\(\s*committing,\s*[^,]+,\s*"([a-z_]+)"',
]


def server_error_codes() -> set:
    codes = set()
    for path in SERVER_SRC.rglob("*.rs"):
        text = path.read_text()
        for pat in _PATTERNS:
            codes.update(re.findall(pat, text))
    return codes


def test_every_server_error_code_has_a_class() -> None:
    if not SERVER_SRC.is_dir():
        pytest.skip(f"the server's source is not at {SERVER_SRC}")
    codes = server_error_codes()
    # The scan found the codes it should (it is not silently matching nothing).
    assert {"conflict", "document_not_found", "overloaded", "disk_full", "unauthorized",
            "too_many_connections", "request_timeout", "invalid_message"} <= codes
    missing = sorted(c for c in codes if c not in E.ERROR_CLASSES)
    assert not missing, f"server error codes without an exception class: {missing}"
    for code, cls in E.ERROR_CLASSES.items():
        assert cls.code == code and issubclass(cls, E.KilnError)


def test_unknown_code_falls_back_by_status() -> None:
    e = E.error_from_response(503, b'{"error":"brand_new","message":"m"}')
    assert type(e) is E.ServiceUnavailableError and e.code == "brand_new"
    e = E.error_from_response(502, b"bad gateway")
    assert isinstance(e, E.ServerError) and "bad gateway" in e.message
    e = E.error_from_response(503, b'{"error":"overloaded","message":"x"}',
                              {"retry-after": "1"})
    assert isinstance(e, E.OverloadedError) and e.retry_after == 1.0


def test_real_error_answers(server, store: DocumentStore) -> None:
    with pytest.raises(E.DocumentNotFoundError) as info:
        store.request("GET", store.doc_path("nope/1"))
    assert info.value.status == 404 and '"nope/1"' in info.value.message

    with DocumentStore(server.url, "no_such_database") as other:
        with pytest.raises(E.DatabaseNotFoundError):
            other.get("a/1")

    with pytest.raises(E.DatabaseExistsError):
        store.create_database(exist_ok=False)

    with pytest.raises(E.MalformedJsonError) as info:
        store.request("PUT", store.doc_path("a/1"), content=b'{"a": 1,,}')
    assert "column" in info.value.message

    with pytest.raises(E.InvalidDocumentError):
        store.request("PUT", store.doc_path("a/1"), content=b"[1, 2]")

    with pytest.raises(E.InvalidEtagError):
        store.request("PUT", store.doc_path("a/1"), json_body={}, headers={"If-Match": '"zz"'})

    with pytest.raises(E.InvalidPreconditionError):
        store.request("PUT", store.doc_path("a/1"), json_body={},
                      headers={"If-Match": "*", "If-None-Match": "*"})

    with pytest.raises(E.ConcurrencyError) as info:
        store.put("a/2", {"v": 1})
        store.request("PUT", store.doc_path("a/2"), json_body={}, headers={"If-None-Match": "*"})
    assert info.value.current_etag

    with pytest.raises(E.PageSizeTooLargeError):
        store.request("GET", f"{store.db_path}/docs", params={"page_size": 10**9})

    with pytest.raises(E.InvalidPageSizeError):
        store.request("GET", f"{store.db_path}/docs", params={"page_size": 0})

    with pytest.raises(E.InvalidQueryError):
        store.request("GET", f"{store.db_path}/docs", params={"page_size": "many"})

    with pytest.raises(E.InvalidWaitError):
        store.request("GET", f"{store.db_path}/changes", params={"wait_ms": 10**9})

    with pytest.raises(E.RouteNotFoundError):
        store.request("GET", "/no/such/route")

    with pytest.raises(E.MethodNotAllowedError):
        store.request("PATCH", store.db_path)

    with pytest.raises(E.InvalidDatabaseNameError):
        DocumentStore(server.url, "bad name!").create_database()


def test_etag_from_an_earlier_database(server, db_name) -> None:
    with DocumentStore(server.url, db_name) as st:
        st.create_database()
        etag = st.put("a/1", {"v": 1})
        st.put("a/2", {"v": 1})
        st.delete_database()
        st.create_database()
        with pytest.raises(E.EtagFromOtherIncarnationError) as info:
            st.request("GET", f"{st.db_path}/changes", params={"since": etag})
        assert info.value.status == 410
