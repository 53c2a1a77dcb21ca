"""The ``Checkpointer`` contract and its stores."""

from __future__ import annotations

from threadloom.persistence.base import Checkpointer
from threadloom.persistence.clock import SystemClock
from threadloom.persistence.memory.store import InMemoryCheckpointer
from threadloom.persistence.opening import open_store
from threadloom.persistence.urls import DEFAULT_SQLITE_PATH, redact_url, sqlite_file, url_secrets

__all__ = [
    "DEFAULT_SQLITE_PATH",
    "Checkpointer",
    "InMemoryCheckpointer",
    "SystemClock",
    "open_store",
    "redact_url",
    "sqlite_file",
    "url_secrets",
]
