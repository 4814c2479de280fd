"""Exceptions: one class per error code the server sends.

The server answers errors as ``{"error": code, "message": text}`` (plus
``current_etag`` on a conflict). :func:`error_from_response` turns such an answer into
the class registered for its code in :data:`ERROR_CLASSES`; an unknown code falls back
to a class chosen by the HTTP status, so a newer server never breaks the client.

The codes and their statuses come from the server's one list, generated into
``_codes.py`` (:data:`SERVER_ERROR_CODES`); the tests check that every one of them has
its class here, under the class of its status.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Type

from ._codes import SERVER_ERROR_CODES


class KilnError(Exception):
    """Base of every error this client raises.

    ``node`` is the URL of the node that answered it (or could not be reached), when a
    store set it; None otherwise.
    """

    code: str = "error"
    node: Optional[str] = None

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        status: Optional[int] = None,
        body: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.status = status
        self.body: Dict[str, Any] = dict(body or {})

    def __str__(self) -> str:
        prefix = f"{self.status} " if self.status else ""
        return f"{prefix}{self.code}: {self.message}"


# --- client-side errors -------------------------------------------------------------


class ClientError(KilnError):
    """Raised by the client itself, not sent by the server."""


class RequestBudgetExceededError(ClientError):
    """A session made more requests than its budget (``max_requests``, default 30)."""

    code = "request_budget_exceeded"


class SessionClosedError(ClientError):
    code = "session_closed"


class ConnectionFailedError(ClientError):
    """The server could not be reached (refused, reset, TLS failure, timeout)."""

    code = "connection_failed"


class WriteOutcomeUnknownError(ClientError):
    """A write failed during a failover after it was sent (the connection broke, or
    the cluster answered ``no_quorum`` / ``not_leader``), so it may or may not have
    been applied, and it was not resent because resending it could apply it twice (it
    makes the server generate an id: a second attempt would create a second document).
    ``cause`` is the failure."""

    code = "write_outcome_unknown"

    def __init__(self, message: str, *, cause: Optional[KilnError] = None,
                 **kw: Any) -> None:
        super().__init__(message, **kw)
        self.cause = cause


class RetriedWriteError(KilnError):
    """Base of the errors of a write that was resent once after a failover whose first
    attempt may have been applied, and whose second attempt was refused in a way the
    first one would explain: ``first_error`` is how the first attempt failed,
    ``retry_error`` the server's answer to the second. Raised as
    :class:`RetryConflictError` or :class:`RetryNotFoundError` (which are also a
    :class:`ConcurrencyError` and a :class:`NotFoundError`)."""

    first_error: Optional[KilnError] = None
    retry_error: Optional[KilnError] = None


class BulkInsertError(KilnError):
    """A bulk insert stopped: ``line`` names the first line not written; every line
    before it was committed (``acked`` documents)."""

    code = "bulk_insert_failed"

    def __init__(self, message: str, *, line: Optional[int] = None, acked: int = 0,
                 last_etag: Optional[str] = None, cause: Optional[KilnError] = None,
                 **kw: Any) -> None:
        super().__init__(message, **kw)
        self.line = line
        self.acked = acked
        self.last_etag = last_etag
        self.cause = cause


# --- server errors by status family ---------------------------------------------------


class BadRequestError(KilnError):
    """400: the request is malformed."""


class AuthenticationError(KilnError):
    """401 ``unauthorized``: no API key, or a key the server does not know."""

    code = "unauthorized"


class ForbiddenError(KilnError):
    """403 ``forbidden``: the key or certificate lacks the permission the request needs
    (the message names it: ``read``, ``read_write`` or ``admin`` of a database, or
    ``operator``). Nothing was changed; retrying with the same key will not help."""

    code = "forbidden"


class NotFoundError(KilnError):
    """404."""


class MethodNotAllowedError(KilnError):
    code = "method_not_allowed"


class UnsupportedMediaTypeError(KilnError):
    """415 ``unsupported_media_type``: e.g. a JSON Patch sent to PATCH, which takes a
    JSON merge patch (RFC 7396)."""

    code = "unsupported_media_type"


class RequestTimeoutError(KilnError):
    code = "request_timeout"


class ConflictError(KilnError):
    """409."""


class GoneError(KilnError):
    """410."""


class PayloadTooLargeError(KilnError):
    """413."""


class TooManyConnectionsError(KilnError):
    """429 ``too_many_connections``."""

    code = "too_many_connections"


class ServerError(KilnError):
    """500: a fault inside the server (the message carries an error id for its log)."""


class ServiceUnavailableError(KilnError):
    """503: try again later."""

    @property
    def retry_after(self) -> Optional[float]:
        v = self.body.get("_retry_after")
        return float(v) if v is not None else None


class InsufficientStorageError(KilnError):
    """507."""


# --- one class per code --------------------------------------------------------------


class InvalidDatabaseNameError(BadRequestError):
    code = "invalid_database_name"


class InvalidIdError(BadRequestError):
    code = "invalid_id"


class InvalidCollectionError(BadRequestError):
    code = "invalid_collection"


class MalformedJsonError(BadRequestError):
    code = "malformed_json"


class InvalidDocumentError(BadRequestError):
    code = "invalid_document"


class InvalidEtagError(BadRequestError):
    code = "invalid_etag"


class InvalidPreconditionError(BadRequestError):
    code = "invalid_precondition"


class InvalidQueryError(BadRequestError):
    """``invalid_query``: a bad query string parameter, or a query the server's query
    language rejects (its message points at the line and column)."""

    code = "invalid_query"


class InvalidIndexError(BadRequestError):
    """``invalid_index``: an index definition the server refuses (name, fields)."""

    code = "invalid_index"


class QueryTooExpensiveError(BadRequestError):
    """``query_too_expensive``: a query no index covers over more documents than the
    server scans without one (``kiln serve --max-scan-docs``)."""

    code = "query_too_expensive"


class IndexNotFoundError(NotFoundError):
    code = "index_not_found"


class IndexExistsError(ConflictError):
    code = "index_exists"


class InvalidRevisionsConfigError(BadRequestError):
    """``invalid_revisions_config``: a revisions configuration the server refuses
    (``max_revisions`` not in 1..=10,000, ``max_age_ms`` 0, an unknown field)."""

    code = "invalid_revisions_config"


class RevisionNotFoundError(NotFoundError):
    """``revision_not_found``: a revert to an etag the document has no revision of
    (never had, trimmed or purged)."""

    code = "revision_not_found"


class InvalidAttachmentError(BadRequestError):
    """``invalid_attachment``: a bad attachment name or content type, or an
    ``@attachments`` entry naming bytes the database does not hold."""

    code = "invalid_attachment"


class AttachmentNotFoundError(NotFoundError):
    """``attachment_not_found``: the document has no attachment of that name."""

    code = "attachment_not_found"


class RangeNotSatisfiableError(KilnError):
    """``range_not_satisfiable``: a byte range starting past the attachment's end."""

    code = "range_not_satisfiable"


class InvalidSubscriptionError(BadRequestError):
    """``invalid_subscription``: a data subscription's name, start or batch size the
    server refuses (its query's errors are :class:`InvalidQueryError`)."""

    code = "invalid_subscription"


class SubscriptionNotFoundError(NotFoundError):
    code = "subscription_not_found"


class SubscriptionExistsError(ConflictError):
    """``subscription_exists``: a data subscription of that name exists already."""

    code = "subscription_exists"


class SubscriptionBusyError(ConflictError):
    """``subscription_busy``: another worker holds the data subscription (a worker
    that asked for it only if free)."""

    code = "subscription_busy"


class MalformedRequestError(BadRequestError):
    """``bad_request``: a request the server cannot parse as HTTP/1.1 (a malformed head,
    a target with characters a URL cannot hold), or plain HTTP sent to its TLS port."""

    code = "bad_request"


class InvalidPathError(BadRequestError):
    code = "invalid_path"


class InvalidHeaderError(BadRequestError):
    code = "invalid_header"


class InvalidPageSizeError(BadRequestError):
    code = "invalid_page_size"


class PageSizeTooLargeError(BadRequestError):
    code = "page_size_too_large"


class InvalidWaitError(BadRequestError):
    code = "invalid_wait"


class BodyReadFailedError(BadRequestError):
    code = "body_read_failed"


class InvalidMessageError(BadRequestError):
    """Changes feed: the server could not read a message the client sent."""

    code = "invalid_message"


class UnsupportedMessageError(BadRequestError):
    """Changes feed: a binary frame."""

    code = "unsupported"


class TooManySubscriptionsError(BadRequestError):
    """Changes feed: more subscriptions on one connection than the server allows."""

    code = "too_many_subscriptions"


class ChangesReadFailedError(ServerError):
    """Changes feed: the server could not read the change log for a backlog."""

    code = "read_failed"


class RouteNotFoundError(NotFoundError):
    """``not_found``: the server has no such endpoint (an older server, or a feature
    it does not have, such as queries before indexes landed)."""

    code = "not_found"


class DatabaseNotFoundError(NotFoundError):
    code = "database_not_found"


class DocumentNotFoundError(NotFoundError):
    code = "document_not_found"


class DatabaseExistsError(ConflictError):
    code = "database_exists"


class ConcurrencyError(ConflictError):
    """``conflict``: an ``If-Match`` (or create-only) condition failed.

    ``id`` names the document, ``expected_etag`` the etag the client sent (None for a
    create-only write), ``current_etag`` the document's etag on the server (None when
    it does not exist).
    """

    code = "conflict"

    def __init__(self, message: str, *, id: Optional[str] = None,
                 expected_etag: Optional[str] = None, current_etag: Optional[str] = None,
                 **kw: Any) -> None:
        super().__init__(message, **kw)
        self.id = id
        self.expected_etag = expected_etag
        self.current_etag = current_etag

    def __str__(self) -> str:
        return (f"409 conflict on document {self.id!r}: expected etag {self.expected_etag!r}, "
                f"current etag {self.current_etag!r} ({self.message})")


class RetryConflictError(RetriedWriteError, ConcurrencyError):
    """A write resent after a failover was refused with a conflict (409): its
    ``If-Match`` (or create-only) condition no longer holds, most likely because the
    first attempt was applied before its answer was lost. ``code`` is the server's
    (``conflict``, or ``database_exists`` for a database created twice)."""


class RetryNotFoundError(RetriedWriteError, NotFoundError):
    """A delete resent after a failover found nothing to delete (404), most likely
    because the first attempt deleted it before its answer was lost."""


class EtagFromOtherIncarnationError(GoneError):
    code = "etag_from_other_incarnation"


class DocumentTooLargeError(PayloadTooLargeError):
    code = "document_too_large"


class BatchTooLongError(PayloadTooLargeError):
    code = "batch_too_long"


class BodyTooLargeError(PayloadTooLargeError):
    code = "body_too_large"


class AttachmentTooLargeError(PayloadTooLargeError):
    """``attachment_too_large``: an attachment upload over the server's
    ``--max-attachment-bytes``; nothing of it was kept."""

    code = "attachment_too_large"


class TooLargeError(PayloadTooLargeError):
    """``too_large``: a value or a transaction beyond the storage engine's limits."""

    code = "too_large"


class InternalServerError(ServerError):
    code = "internal_error"


class CorruptionError(ServerError):
    code = "corruption"


class StorageError(ServerError):
    code = "storage_error"


class DatabaseBusyError(ServiceUnavailableError):
    code = "database_busy"


class OverloadedError(ServiceUnavailableError):
    """503 ``overloaded`` with ``Retry-After``."""

    code = "overloaded"


class ShuttingDownError(ServiceUnavailableError):
    code = "shutting_down"


class IoError(ServiceUnavailableError):
    code = "io_error"


class DatabaseFailedError(ServiceUnavailableError):
    """503 ``database_failed``: the database refuses writes until the server restarts."""

    code = "database_failed"


class NotLeaderError(ServiceUnavailableError):
    """``not_leader``: a cluster node that is not the leader was sent a write. A
    follower answers it as a 307 whose ``Location`` (:attr:`leader_url`) is the same
    path on the leader; a leader that lost its leadership while the write was pending
    answers it as a 503. A store retries such a write once on the leader by itself."""

    code = "not_leader"

    @property
    def leader_url(self) -> Optional[str]:
        v = self.body.get("_location")
        return str(v) if v is not None else None


class NoQuorumError(ServiceUnavailableError):
    """``no_quorum``: the cluster has no leader, or its leader no majority, so the write
    was not acknowledged (a store retries it once on the leader it finds).
    :attr:`outcome` says whether it surely did not happen."""

    code = "no_quorum"

    @property
    def outcome(self) -> Optional[str]:
        """``"not_written"`` (refused before the leader logged it), ``"unknown"`` (it
        entered the leader's log and no majority answered in time: it may still be
        committed), or None from a server that does not say."""
        v = self.body.get("outcome")
        return str(v) if v is not None else None


class ClusterError(ServiceUnavailableError):
    """``cluster_error``: the cluster could not take the write (a Raft failure)."""

    code = "cluster_error"


class NotClusteredError(NotFoundError):
    """``not_clustered``: ``GET /cluster`` on a server that is not part of a cluster."""

    code = "not_clustered"


class DiskFullError(InsufficientStorageError):
    code = "disk_full"


class BackupInvalidError(BadRequestError):
    """Restore: a backup file is damaged, truncated or not a Kiln backup (the message
    names the part and the byte offset)."""

    code = "backup_invalid"


class BackupReadFailedError(BadRequestError):
    """Restore: the server could not read the backup stream it was sent."""

    code = "backup_read_failed"


class BackupChainBrokenError(BadRequestError):
    """Restore: the backups do not form one chain (a gap, a wrong base, out of order,
    another database's or chain's increment)."""

    code = "backup_chain_broken"


class InvalidRestorePointError(BadRequestError):
    """Restore: the ``until`` point is malformed or outside the chain."""

    code = "invalid_restore_point"


class IncrementNotPossibleError(ConflictError):
    """Backup: an increment cannot be complete (no chain, another chain, or the base's
    history was trimmed): take a full backup with a chain."""

    code = "increment_not_possible"


ERROR_CLASSES: Dict[str, Type[KilnError]] = {
    cls.code: cls
    for cls in [
        AuthenticationError, ForbiddenError, MethodNotAllowedError, UnsupportedMediaTypeError,
        RequestTimeoutError,
        TooManyConnectionsError, InvalidDatabaseNameError, InvalidIdError,
        InvalidCollectionError, MalformedJsonError, InvalidDocumentError, InvalidEtagError,
        InvalidPreconditionError, InvalidQueryError, MalformedRequestError, InvalidPathError,
        InvalidHeaderError,
        InvalidPageSizeError, PageSizeTooLargeError, InvalidWaitError, BodyReadFailedError,
        InvalidMessageError, UnsupportedMessageError, TooManySubscriptionsError,
        ChangesReadFailedError, RouteNotFoundError, DatabaseNotFoundError,
        DocumentNotFoundError, DatabaseExistsError, ConcurrencyError,
        EtagFromOtherIncarnationError, DocumentTooLargeError, BatchTooLongError,
        BodyTooLargeError, TooLargeError, InternalServerError, CorruptionError,
        BackupInvalidError, BackupReadFailedError, BackupChainBrokenError,
        InvalidRestorePointError, IncrementNotPossibleError,
        StorageError, DatabaseBusyError, OverloadedError, ShuttingDownError, IoError,
        DatabaseFailedError, DiskFullError, InvalidIndexError, QueryTooExpensiveError,
        IndexNotFoundError, IndexExistsError, InvalidRevisionsConfigError,
        RevisionNotFoundError, InvalidAttachmentError, AttachmentNotFoundError,
        RangeNotSatisfiableError, AttachmentTooLargeError, InvalidSubscriptionError, SubscriptionNotFoundError,
        SubscriptionExistsError, SubscriptionBusyError, NotLeaderError, NoQuorumError, ClusterError,
        NotClusteredError,
    ]
}
"""Every error code the server sends, mapped to its exception class."""

_BY_STATUS: Dict[int, Type[KilnError]] = {
    400: BadRequestError, 401: AuthenticationError, 403: ForbiddenError, 404: NotFoundError,
    405: MethodNotAllowedError, 408: RequestTimeoutError, 409: ConflictError,
    410: GoneError, 413: PayloadTooLargeError, 415: UnsupportedMediaTypeError,
    429: TooManyConnectionsError,
    500: ServerError, 503: ServiceUnavailableError, 507: InsufficientStorageError,
}


def error_class(code: Optional[str], status: Optional[int]) -> Type[KilnError]:
    if code and code in ERROR_CLASSES:
        return ERROR_CLASSES[code]
    # A WebSocket message's code comes without an HTTP status: the server's list has it.
    if status is None and code in SERVER_ERROR_CODES:
        status = SERVER_ERROR_CODES[code]
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if status is not None and status >= 500:
        return ServerError
    return KilnError


def make_error(code: Optional[str], message: str, status: Optional[int] = None,
               body: Optional[Mapping[str, Any]] = None, **extra: Any) -> KilnError:
    cls = error_class(code, status)
    if cls is ConcurrencyError:
        extra.setdefault("current_etag", (body or {}).get("current_etag"))
        return ConcurrencyError(message, code=code, status=status, body=body, **extra)
    return cls(message, code=code or cls.code, status=status, body=body)


def error_from_response(status: int, content: bytes,
                        headers: Optional[Mapping[str, str]] = None) -> KilnError:
    """The exception for an error answer (any status >= 400)."""
    import json

    body: Dict[str, Any] = {}
    try:
        parsed = json.loads(content) if content else {}
        if isinstance(parsed, dict):
            body = parsed
    except ValueError:
        pass
    code = body.get("error") if isinstance(body.get("error"), str) else None
    message = body.get("message")
    if not isinstance(message, str):
        message = content.decode("utf-8", "replace")[:500] or f"HTTP {status}"
    if headers is not None and headers.get("retry-after"):
        body["_retry_after"] = headers.get("retry-after")
    if headers is not None and headers.get("location"):
        body["_location"] = headers.get("location")
    return make_error(code, message, status, body)
