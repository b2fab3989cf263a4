"""Which running completion request of a document a newer one supersedes, in the Jupyter extension (the
editor session's documents, partitioned by Jupyter user): any newer request of the same Jupyter user an
older one, but a warm-up never an answer someone waits for (the server's rule too), and one user's request
never another's (a collaborative server's users share paths)."""

from __future__ import annotations

from collections.abc import Callable

from langchain_starcoder.jupyter.completer import Completer


def request(log: list[tuple[str, str]], name: str) -> Callable[[str], None]:
    return lambda why: log.append((name, why))


def test_a_newer_request_supersedes_the_older_of_its_document_only(tmp_path):
    completer, log = Completer(str(tmp_path)), []
    older, other = request(log, "older"), request(log, "other")
    completer.newest("ada", "a.ipynb", older)
    completer.newest("ada", "b.ipynb", other)
    completer.newest("ada", "a.ipynb", request(log, "newer"))
    assert log == [("older", "superseded")]


def test_a_warm_up_never_supersedes_a_generating_request_and_any_newer_request_supersedes_it(tmp_path):
    completer, log = Completer(str(tmp_path)), []
    answering, warming = request(log, "answering"), request(log, "warming")
    completer.newest("ada", "a.ipynb", answering)
    completer.newest("ada", "a.ipynb", warming, warm_up=True)
    assert log == []  # the user still waits for the answer: the warm-up runs beside it
    completer.newest("ada", "a.ipynb", request(log, "warming again"), warm_up=True)
    assert log == [("warming", "superseded")]  # a newer warm-up replaces the older
    completer.newest("ada", "a.ipynb", request(log, "keystroke"))
    assert log[1:] == [("answering", "superseded"), ("warming again", "superseded")]


def test_an_ended_request_is_superseded_no_more(tmp_path):
    completer, log = Completer(str(tmp_path)), []
    first = completer.newest("ada", "a.ipynb", request(log, "first"))
    completer.ended(first)
    completer.newest("ada", "a.ipynb", request(log, "second"))
    assert log == []
    completer.newest("ada", "a.ipynb", request(log, "third"))
    assert log == [("second", "superseded")]


def test_one_users_request_never_supersedes_anothers_for_the_same_document(tmp_path):
    completer, log = Completer(str(tmp_path)), []
    ada = completer.newest("ada", "shared.ipynb", request(log, "ada"))
    completer.newest("bob", "shared.ipynb", request(log, "bob"))
    completer.newest("bob", "shared.ipynb", request(log, "bob again"), warm_up=True)
    assert log == []  # both still answer: each user's newest request
    completer.newest("ada", "shared.ipynb", request(log, "ada again"))
    assert log == [("ada", "superseded")]  # the same user's newer request supersedes as before
    completer.ended(ada)
    completer.newest("bob", "shared.ipynb", request(log, "bob's keystroke"))
    assert log[1:] == [("bob", "superseded"), ("bob again", "superseded")]


def test_a_request_without_a_path_supersedes_none_and_is_superseded_by_none(tmp_path):
    completer, log = Completer(str(tmp_path)), []
    completer.newest("ada", "", request(log, "untitled"))
    completer.newest("ada", "", request(log, "untitled again"))
    completer.newest("ada", "a.ipynb", request(log, "named"))
    assert log == []  # nothing says which document a request without a path is about
