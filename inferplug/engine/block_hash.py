"""Prefix-cache keys of full KV blocks: the one place block identity is defined.

A block's key chains its parent's key, its token ids and an extra key (the request's cache
salt; later adapters or RAG document keys), so equal keys mean equal KV.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence


def hash_block(parent: bytes | None, token_ids: Sequence[int], extra_key: str | None = None) -> bytes:
    h = hashlib.blake2b(parent or b"", digest_size=16)
    h.update(array("q", token_ids).tobytes())
    if extra_key:
        h.update(b"\x00salt:" + extra_key.encode())
    return h.digest()
