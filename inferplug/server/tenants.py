"""Which tenant a request belongs to, as the prefix-cache salt: requests of different tenants never share cached
KV, so one cannot probe another's prompts through timing or `cached_tokens`.

A tenant is the API key the request presents (when the server checks keys: `--api-key` may list several, one per
tenant), plus the value of the header the operator names in [server] tenant_header (set by a trusted proxy in
front). With neither, every request is one tenant and shares the cache.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from inferplug.profile_server import ServerOptions


def cache_salt(headers: Mapping[str, str], options: ServerOptions, keyed: bool) -> str | None:
    """`keyed`: the server checked the request's key (without keys, the header is whatever a client sent)."""
    key = headers.get("authorization", "") if keyed else ""
    tenant = headers.get(options.tenant_header, "") if options.tenant_header else ""
    if not (key or tenant):
        return None
    # hashed: the salt is kept in block hashes, and no key should sit in memory longer than it must
    return hashlib.sha256(f"{key}\x00{tenant}".encode()).hexdigest()[:32]
