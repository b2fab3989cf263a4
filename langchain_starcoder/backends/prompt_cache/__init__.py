"""Prompt caches: KV caches of earlier prompts, reused by the longest shared token prefix.

:mod:`.memory` keeps recent ones in the process; :mod:`.disk` keeps long ones in a folder across
processes (:mod:`.files` is their file format, :mod:`.layout` the shapes a file must have,
:mod:`.fingerprint` what they are valid for; ``loading.private_folder`` keeps their folder private).
"""

from .disk import DiskPromptCache, PromptCacheNotice
from .fingerprint import cache_key, hash_weights_aside, vocab_fingerprint, weights_fingerprint
from .layout import CacheLayout
from .memory import PromptCacheStore, prefix_copy

__all__ = [
    "CacheLayout",
    "DiskPromptCache",
    "PromptCacheNotice",
    "PromptCacheStore",
    "cache_key",
    "hash_weights_aside",
    "prefix_copy",
    "vocab_fingerprint",
    "weights_fingerprint",
]
