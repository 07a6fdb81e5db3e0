"""Block hashes of token ids: what an explicit-mode plan compares with what a
session stored, so stored KV is used only for the very tokens it was computed
from (docs/kv-cache.md "The content check").

The one definition, the same as Go's ``kvlayout.BlockHashes``::

    h[-1] = 16 zero bytes
    h[i]  = SHA-256(h[i-1] || uint32le(id) for each token id of block i)[:16]

Block ``i`` is tokens ``[i*page_tokens, (i+1)*page_tokens)``; the last block
may be partial. Each hash is 32 lowercase hex digits. python/tests/
test_blockhash.py checks this against ``gd2fs session hashes``."""

from __future__ import annotations

import hashlib
import struct
from typing import Iterable, List, Sequence

BLOCK_HASH_SIZE = 16


def _ids(token_ids: Iterable[int]) -> List[int]:
    out = []
    for i, t in enumerate(token_ids):
        if isinstance(t, bool) or not isinstance(t, int):
            try:
                t = int(t)  # numpy and torch integers
            except (TypeError, ValueError):
                raise TypeError(f"token id {i} is {type(t).__name__}, not an int") from None
        if not 0 <= t <= 0xFFFFFFFF:
            raise ValueError(f"token id {i} is {t}: token ids are 0 to 4294967295")
        out.append(t)
    return out


def block_hashes(token_ids: Sequence[int], page_tokens: int) -> List[str]:
    """The chain of block hashes of ``token_ids`` in blocks of
    ``page_tokens`` (the model layout's page_tokens): one per block, the last
    of a partial block. What ``plan(..., block_hashes=...)`` takes."""
    if isinstance(page_tokens, bool) or not isinstance(page_tokens, int) or page_tokens < 1:
        raise ValueError(f"page_tokens must be an int of at least 1, not {page_tokens!r}")
    ids = _ids(token_ids)
    out: List[str] = []
    parent = bytes(BLOCK_HASH_SIZE)
    for at in range(0, len(ids), page_tokens):
        block = ids[at:at + page_tokens]
        parent = hashlib.sha256(parent + struct.pack("<%dI" % len(block), *block)).digest()[:BLOCK_HASH_SIZE]
        out.append(parent.hex())
    return out
