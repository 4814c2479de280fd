"""Attachments: streamed upload and download, ranges, the document's list, delete."""

import io

import pytest

from kiln_client import DocumentStore
from kiln_client.errors import AttachmentNotFoundError, ConcurrencyError


def test_attachments_stream_in_and_out(store: DocumentStore) -> None:
    store.put("files/1", {"t": 1})
    data = bytes(range(256)) * 40_000  # ~10 MB
    out = store.put_attachment("files/1", "blob.bin", io.BytesIO(data),
                               content_type="application/x-test")
    assert out["attachment"]["size"] == len(data)
    with store.get_attachment("files/1", "blob.bin") as r:
        got = b"".join(r.iter_bytes())
        assert r.headers["etag"] == f'"{out["attachment"]["hash"]}"'
    assert got == data
    with store.get_attachment("files/1", "blob.bin", byte_range=(10, 19)) as r:
        assert r.status_code == 206
        assert r.read() == data[10:20]
    listed = store.attachments("files/1")
    assert [a["name"] for a in listed] == ["blob.bin"]
    with pytest.raises(ConcurrencyError):
        store.put_attachment("files/1", "x", b"x", if_match="1-00000000")
    store.put_attachment("files/1", "small.txt", b"hello", content_type="text/plain")
    assert store.attachment_bytes("files/1", "small.txt") == b"hello"
    store.delete_attachment("files/1", "blob.bin")
    with pytest.raises(AttachmentNotFoundError):
        store.attachment_bytes("files/1", "blob.bin")


def test_an_id_containing_attachments_is_a_document_and_has_attachments(
        store: DocumentStore) -> None:
    # Sent with literal slashes, the server would read this id as document
    # "notes/x"'s attachment "y": the client encodes its slashes.
    doc_id = "notes/x/attachments/y"
    store.put(doc_id, {"t": 1})
    assert store.get(doc_id)["t"] == 1
    assert store.get("notes/x") is None
    store.put_attachment(doc_id, "a.txt", b"abc", content_type="text/plain")
    assert store.attachment_bytes(doc_id, "a.txt") == b"abc"
    assert [a["name"] for a in store.attachments(doc_id)] == ["a.txt"]
    store.delete(doc_id)
    assert store.get(doc_id) is None
