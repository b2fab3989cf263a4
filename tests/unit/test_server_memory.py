"""The server's partitions (tenants.py), which key the editor session's documents and the prompt cache:
one per tenant and ``cache_salt``, the shared one the engine's own (what the session remembers of each
document is in test_editor_memory.py)."""

from __future__ import annotations

from langchain_starcoder.server.tenants import partition


def test_partitions_differ_by_tenant_and_by_salt_and_the_shared_one_is_the_engines_own():
    tenants = ["", "a" * 64, "b" * 64]
    salts = [None, "x", "y"]
    seen = {partition(t, s) for t in tenants for s in salts}
    assert len(seen) == 9
    assert partition("", None) is None
    assert partition("a" * 64, None) == partition("a" * 64, None)
