"""Python client for the Kiln document server.

>>> from kiln_client import DocumentStore
>>> store = DocumentStore("http://127.0.0.1:8080", "shop")
>>> with store.session() as s:
...     s.store({"name": "Ada", "age": 36}, "users/ada")
...     s.save_changes()
"""

from .aio import AsyncDocumentStore, AsyncSession
from .bulk import BulkInsert
from .cache import CacheStats, HttpCache
from .changes import Change, Changes, Subscription
from .errors import *  # noqa: F401,F403 (every exception class)
from .errors import ERROR_CLASSES, ConcurrencyError, KilnError, RequestBudgetExceededError
from .query import Query, QueryResult
from .session import Session
from .store import DocumentStore
from .subscriptions import DataSubscription, SubscriptionBatch, SubscriptionClosedError

__version__ = "0.1.0"

__all__ = [
    "DocumentStore", "Session", "AsyncDocumentStore", "AsyncSession", "Query", "QueryResult", "BulkInsert", "Changes", "Change",
    "Subscription", "HttpCache", "CacheStats", "KilnError", "ConcurrencyError",
    "RequestBudgetExceededError", "ERROR_CLASSES", "__version__",
    "DataSubscription", "SubscriptionBatch", "SubscriptionClosedError",
]
