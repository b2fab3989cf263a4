"""Which running completion request of a document a newer one supersedes, in the Jupyter extension: any
newer request an older one, but a warm-up never an answer someone waits for (the server's rule too)."""

from __future__ import annotations

from collections.abc import Callable

from langchain_starcoder.jupyter.completer import Completer


def request(log: list[tuple[str, str]], name: str) -> Callable[[str], None]:
    return lambda why: log.append((name, why))


def test_a_newer_request_supersedes_the_older_of_its_document_only(tmp_path):
    completer, log = Completer(str(tmp_path)), []
    older, other = request(log, "older"), request(log, "other")
    completer.newest("a.ipynb", older)
    completer.newest("b.ipynb", other)
    completer.newest("a.ipynb", request(log, "newer"))
    assert log == [("older", "superseded")]


def test_a_warm_up_never_supersedes_a_generating_request_and_any_newer_request_supersedes_it(tmp_path):
    completer, log = Completer(str(tmp_path)), []
    answering, warming = request(log, "answering"), request(log, "warming")
    completer.newest("a.ipynb", answering)
    completer.newest("a.ipynb", warming, warm_up=True)
    assert log == []  # the user still waits for the answer: the warm-up runs beside it
    completer.newest("a.ipynb", request(log, "warming again"), warm_up=True)
    assert log == [("warming", "superseded")]  # a newer warm-up replaces the older
    completer.newest("a.ipynb", request(log, "keystroke"))
    assert log[1:] == [("answering", "superseded"), ("warming again", "superseded")]


def test_an_ended_request_is_superseded_no_more(tmp_path):
    completer, log = Completer(str(tmp_path)), []
    first = request(log, "first")
    completer.newest("a.ipynb", first)
    completer.ended("a.ipynb", first)
    completer.newest("a.ipynb", request(log, "second"))
    assert log == []
    completer.newest("a.ipynb", request(log, "third"))
    assert log == [("second", "superseded")]
