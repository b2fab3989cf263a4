"""What the editor session remembers of a document, bounded and matched with care: the context order keeps
digests in a bounded number, not whole files (issue 38, item 6), and a window matches the remembered prefix
only over enough text to say where in the file it is (item 3)."""

from __future__ import annotations

import gc
import tracemalloc

from langchain_starcoder.editor.stable_context import MAX_DOCUMENTS, MAX_FILES, ContextOrders
from langchain_starcoder.editor.stable_prefix import StablePrefixes, slid_start
from langchain_starcoder.editor.supersede import Document
from langchain_starcoder.fim.request import ContextFile

SECRET = (
    "import os\nAWS_SECRET_ACCESS_KEY = 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY'\n"
    "DB_PASSWORD = 'hunter2-prod'\n\n\ndef main("
)


def _files(document: int, count: int, chars: int) -> list[ContextFile]:
    return [
        ContextFile(f"src/f{i}.py", f"# {document} {i}\n" + "x = 1\n" * (chars // 6)) for i in range(count)
    ]


def test_context_orders_keep_digests_not_texts_within_a_byte_bound():
    """The review's load, scaled down: 256 documents of 52 files of 4 KB each (53 MB of text) passed
    through; what stays is digests, bounded in number, so about a MB, not the texts."""
    orders = ContextOrders()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for document in range(MAX_DOCUMENTS):
            files = _files(document, 52, 4096)
            orders.order(Document("tenant", f"f{document}", None), files)
            del files
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(orders) <= MAX_DOCUMENTS and orders.files <= MAX_FILES
    assert kept < 3 * 2**20, f"{kept / 2**20:.1f} MiB kept for {len(orders)} documents"


def test_context_orders_are_bounded_in_files_and_still_order_a_document_over_the_bound():
    orders = ContextOrders(max_documents=100, max_files=10)
    for document in range(5):
        orders.order(Document("t", f"f{document}", None), _files(document, 4, 60))
    assert orders.files <= 10 and len(orders) == 2  # the least recently used went first
    big = _files(9, 12, 60)
    first = Document("t", "big", None)
    assert orders.order(first, big) == list(range(12))  # more files than the bound: ordered, not kept
    assert orders.files <= 10
    # A document's order is kept: the same files in another order come back in the last order.
    document = Document("t", "kept", None)
    files = _files(1, 3, 60)
    orders.order(document, files)
    assert orders.order(document, [files[2], files[0], files[1]]) == [1, 2, 0]


def test_a_short_prefix_does_not_match_another_requests_prefix():
    """The review's case: two trailing blank lines in common pulled a whole secret prefix."""
    assert slid_start(SECRET, "\n\ndef main(") is None
    assert slid_start(SECRET, "\n\n\ndef main(") is None
    prefixes = StablePrefixes()
    document = Document("tenant", "app.py", None)
    prefixes.remember(document, SECRET)
    assert prefixes.extended(document, "\n\ndef main(") is None
    # A real slide (the window lost its first line, kept the rest) still matches.
    assert prefixes.extended(document, SECRET.split("\n", 1)[1] + "):\n") == SECRET + "):\n"
