"""A LangGraph saver of one tenant never writes onto another tenant's thread (the runtime's rule: a thread belongs
to the tenant of its first run), even once the other tenant's saver has released its claim."""

from __future__ import annotations

import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

from threadloom import TenantMismatch
from threadloom.langgraph import ThreadloomSaver
from threadloom.persistence.sqlite.store import SqliteCheckpointer


def test_a_saver_refuses_to_write_onto_another_tenants_thread(tmp_path):
    store = SqliteCheckpointer.open(str(tmp_path / "lg.db"))
    try:
        with ThreadloomSaver(store, tenant_id="acme") as acme:
            written = acme.put(generate_config("t"), generate_checkpoint(), generate_metadata(), {})
        before = [(cp.id, cp.tenant_id) for cp in store.history("t", limit=10)]
        for tenant in ("other", None):
            with ThreadloomSaver(store, tenant_id=tenant) as other:
                with pytest.raises(TenantMismatch):
                    other.put(generate_config("t"), generate_checkpoint(), generate_metadata(), {})
                with pytest.raises(TenantMismatch):
                    other.put_writes(written, [("c", 1)], "task-1")
        assert [(cp.id, cp.tenant_id) for cp in store.history("t", limit=10)] == before
        assert store.current_claim("t") is None  # the refused saver left no claim behind
        with ThreadloomSaver(store, tenant_id="acme") as acme:  # its own tenant goes on
            acme.put(generate_config("t"), generate_checkpoint(), generate_metadata(), {})
        assert len(store.history("t", limit=10)) == 2
    finally:
        store.close()
