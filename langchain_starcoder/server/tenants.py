"""Tenants: each API key is a tenant, whose documents and prompt cache are its own.

A server shared by several users must not let one see another's work: the stable prefix would put one
user's lines into another's prompt, supersession would let one cancel another's request, and the prompt
cache's counts (``tokens_cached``) and timing would tell one user which text another has sent (an oracle:
arXiv 2502.07776). So the server takes several API keys, each a tenant, and everything a request leaves
behind is kept under its **partition**: a digest of its tenant and of the ``cache_salt`` it may carry
(vLLM's field: only requests with the same salt share cached prefixes). The engine gets the partition as its
``cache_salt``, so no KV, cache file or count crosses it. A server with no key has one tenant: every
client's requests share one partition (what any client can then learn of another's is in docs/security.md).

The key itself is compared in constant time and never kept, logged or answered; the tenant is a digest of it.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from typing import Any

from starlette.requests import Request

from .errors import APIError, bad_request

#: The longest ``cache_salt`` a request may carry.
MAX_SALT_CHARS = 256
#: The tenant of a server without API keys: every client.
SHARED = ""


def _digest(key: str) -> bytes:
    return hashlib.sha256(b"langchain-starcoder tenant\0" + key.encode("utf-8", "surrogatepass")).digest()


class Tenants:
    """The API keys a server takes, each a tenant (none: one tenant, :data:`SHARED`, and no key needed)."""

    def __init__(self, keys: Iterable[str]):
        self._digests = tuple(dict.fromkeys(_digest(key) for key in keys if key))

    def __len__(self) -> int:
        return len(self._digests)

    def tenant_of(self, request: Request) -> str:
        """The tenant whose key the request's ``Authorization: Bearer KEY`` holds; 401 without a known key."""
        if not self._digests:
            return SHARED
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        digest = _digest(given.strip()) if scheme.lower() == "bearer" else b""
        found = None
        for known in self._digests:  # every key compared: the time does not say which one matched
            if secrets.compare_digest(digest, known):
                found = known
        if found is None:
            raise APIError(
                401, "A valid API key is needed (Authorization: Bearer KEY).", kind="authentication_error"
            )
        return found.hex()


def request_salt(body: dict[str, Any]) -> str | None:
    """The request's ``cache_salt`` (vLLM's field), checked: a non-empty string of at most
    :data:`MAX_SALT_CHARS` characters, or absent."""
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        raise bad_request("cache_salt must be a non-empty string.", "cache_salt")
    if len(salt) > MAX_SALT_CHARS:
        msg = f"cache_salt has {len(salt)} characters: more than the {MAX_SALT_CHARS} this server takes."
        raise bad_request(msg, "cache_salt")
    return salt


def partition(tenant: str, salt: str | None) -> str | None:
    """The ``cache_salt`` the engine gets for ``tenant``'s request with ``salt``: a digest of both, so no
    two tenants (nor two salts) share one. None for the shared tenant of a server without keys when the
    request has no salt: its cache is the engine's own, as it was before tenants."""
    if tenant == SHARED and salt is None:
        return None
    return hashlib.sha256(f"{tenant}\0{salt or ''}".encode("utf-8", "surrogatepass")).hexdigest()


def salted(settings: dict[str, Any], salt: str | None) -> dict[str, Any]:
    """Engine ``settings`` with ``cache_salt`` ``salt`` (:func:`partition`); as they are for None."""
    return settings if salt is None else {**settings, "cache_salt": salt}
