"""Every error code the server can send maps to its own exception class (read from the
server's source), and real error answers arrive as those classes with the server's
message."""

from __future__ import annotations

import json

import httpx
import pytest

import kiln_client.errors as E
from conftest import REPO
from kiln_client import DocumentStore
from kiln_client._codes import SERVER_ERROR_CODES

def test_every_server_error_code_has_a_class() -> None:
    # The server's one list, generated into the client (crates/kiln-server/tests/
    # client_error_codes.rs keeps it equal to kiln_server::error::ErrorCode::ALL).
    codes = SERVER_ERROR_CODES
    assert {"conflict", "document_not_found", "overloaded", "disk_full", "unauthorized",
            "too_many_connections", "request_timeout", "invalid_message"} <= set(codes)
    missing = sorted(c for c in codes if c not in E.ERROR_CLASSES)
    assert not missing, f"server error codes without an exception class: {missing}"
    extra = sorted(c for c in E.ERROR_CLASSES if c not in codes)
    assert not extra, f"exception classes for codes the server never sends: {extra}"
    for code, cls in E.ERROR_CLASSES.items():
        assert cls.code == code and issubclass(cls, E.KilnError)
        family = E._BY_STATUS.get(codes[code])
        assert family is None or issubclass(cls, family), \
            f"{cls.__name__} ({code}, sent with {codes[code]}) is not a {family.__name__}"


def test_the_generated_list_matches_the_json_one() -> None:
    path = REPO / "clients" / "error-codes.json"
    if not path.is_file():
        pytest.skip(f"no {path}")
    rows = json.loads(path.read_text())["codes"]
    assert {r["code"]: r["status"] for r in rows} == SERVER_ERROR_CODES


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
