"""What an editor's requests share, whichever front answers them (the HTTP server, the Jupyter extension),
with no web framework: ``session`` (:class:`EditorSessions`: each document's requests and memories),
``supersede`` (a newer request for a document cancels the older), ``stable_prefix`` (a window of the lines
before the cursor that slid down the file gets back the lines it dropped, so the prompt keeps its start),
``stable_context`` (each document's context files in their last order) and ``statuses`` (one map from an
error to the status and client-safe message a client gets).
"""

from __future__ import annotations

from .session import EditorSessions, Prepared
from .statuses import RequestError, Status, status_of
from .supersede import CANCELLED, Claim, Document, Documents, document_of

__all__ = [
    "CANCELLED",
    "Claim",
    "Document",
    "Documents",
    "EditorSessions",
    "Prepared",
    "RequestError",
    "Status",
    "document_of",
    "status_of",
]
