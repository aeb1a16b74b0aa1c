"""Prefix-cache keys of full KV blocks: the one place block identity is defined.

A block's key chains its parent's key, its token ids and an extra key (the request's cache
salt; for blocks holding or attending to re-rotated RAG document KV, `doc_approx_key`), so
equal keys mean equal KV.
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


def doc_approx_key(cache_salt: str | None) -> str:
    """The extra key of blocks whose KV is approximate (from the RAG document cache): a plain request never matches."""
    return f"{cache_salt or ''}|doc-approx"


def rekey_from(block_hashes: list[bytes], token_ids: Sequence[int], block_size: int, first: int,
               extra_key: str) -> None:
    """Key every full block from `first` on under extra_key (block_hashes must reach `first`).

    Blocks hashed later (decode) chain from these keys, so they differ from plain keys too."""
    del block_hashes[first:]
    for i in range(first, len(token_ids) // block_size):
        parent = block_hashes[i - 1] if i else None
        block_hashes.append(hash_block(parent, token_ids[i * block_size:(i + 1) * block_size], extra_key))
