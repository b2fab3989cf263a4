"""evaluate(): every hole completed under every configuration by a target, scored, timed, in a report.

A target is what completes a :class:`~langchain_starcoder.fim.request.FIMRequest` as a stream: a
:class:`~langchain_starcoder.StarCoderEngine` in this process (its ``stream_infill`` and
``count_tokens``). Holes go one at a time through all configurations, so an evaluation stopped early
(Ctrl-C) holds complete pairs; each configuration caches prompts apart (``cache_salt``), so none is timed
on another's prefill.

What is scored is what CrossCodeEval scores: a ``line`` or ``cross_file`` hole's completion (the rest of a
statement, their holes' shape) cut by their post-processing (:func:`~.metrics.cceval_truncate`: the first
statement in Python, up to the first ``;``, ``{`` or ``}`` in Java, C# and TypeScript); ``block``,
``call`` and ``span`` holes' (SAFIM's and santacoder-fim's shapes, which score the middle as generated)
as generated. The record keeps both: ``raw`` and ``prediction``.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from .._progress import progress_bar
from ..errors import InvalidParameterError
from ..fim.request import ContextFile, FIMRequest
from ..repo import RepoIndex
from ..types import DEFAULT_MAX_TOKENS, is_int
from .configs import Config, parse_configs
from .execution import DEFAULT_EXEC_TIMEOUT, NOT_RUN, TIMED_OUT, TRUTH_FAILS, TRUTH_TIMED_OUT, Executor
from .holes import Hole
from .metrics import cceval_truncate
from .report import EvalReport, HoleRecord
from .window import cut_to, in_file_room

#: The hole kinds CrossCodeEval's post-processing applies to: the rest of a statement, as its holes.
POSTPROCESSED = frozenset({"line", "cross_file"})


@runtime_checkable
class Target(Protocol):
    """What :func:`evaluate` needs of an engine: a streamed infill and a token count."""

    def stream_infill(self, prefix: FIMRequest, suffix: str = "", **settings: Any) -> Iterable[Any]: ...

    def count_tokens(self, text: str) -> int: ...


def evaluate(
    target: Target,
    holes: Sequence[Hole],
    configs: str | Iterable[str],
    *,
    repo: RepoIndex | str | os.PathLike[str] | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    max_prompt_tokens: int | None = None,
    on_record: Callable[[HoleRecord], None] | None = None,
    exec_command: str | None = None,
    exec_timeout: float = DEFAULT_EXEC_TIMEOUT,
) -> EvalReport:
    """Complete each of ``holes`` under each of ``configs`` (names: ``psm``, ``spm+repo``,
    ``psm+noend``...) with ``target``, greedily, up to ``max_tokens``; score each completion.

    ``repo``: the repository (a :class:`~langchain_starcoder.RepoIndex` or its folder) whose other files
    ``+repo`` configurations give as context (a hole read with its own context, as CrossCodeEval's, uses
    that). A hole that fails (a prompt too long, a target error) is recorded with its error and the
    evaluation goes on; Ctrl-C stops it, and the report holds what was done (``metadata["interrupted"]``).
    ``max_prompt_tokens``: the prompt's budget (default: the context window less ``max_tokens``), the
    repository context's included. ``on_record`` sees each record as it is made (to save progress).

    ``exec_command``: a shell command that runs the repository's tests (``pytest -x -q``); each scored
    prediction is run with it in place, in a temporary copy of ``repo``, within ``exec_timeout`` seconds
    and without the network where the platform allows (``metadata["exec"]`` says), and the record's
    ``passed`` says whether it passed (pass@1 in the summary). A hole whose true middle does not pass is
    not judged (``passed`` None, ``exec_status`` why).
    """
    chosen = parse_configs(configs)
    holes = list(holes)
    if not isinstance(target, Target):
        msg = f"target must be a StarCoderEngine (stream_infill, count_tokens), not {type(target).__name__}."
        raise InvalidParameterError(msg)
    if any(not isinstance(h, Hole) for h in holes):
        msg = "holes must be Hole objects (from cut_holes or read_cceval)."
        raise InvalidParameterError(msg)
    for name, value in (("max_tokens", max_tokens), ("max_prompt_tokens", max_prompt_tokens)):
        if (value is not None or name == "max_tokens") and (not is_int(value) or value < 1):
            msg = f"{name} must be a positive integer, not {value!r}."
            raise InvalidParameterError(msg)
    index = _index(repo, chosen, holes, exec_command)
    executor = None if exec_command is None else _executor(index, exec_command, exec_timeout)
    budgets = {"max_tokens": max_tokens, "max_prompt_tokens": max_prompt_tokens}
    report = EvalReport(metadata=_metadata(target, chosen, holes, index, budgets))
    if executor is not None:
        report.metadata["exec"] = executor.describe()
    room = in_file_room(target, chosen, max_tokens, max_prompt_tokens)
    report.metadata["in_file_tokens"] = room
    bar = progress_bar(len(holes) * len(chosen), "Evaluating", "completion")
    try:
        for hole in holes:
            text = (hole.prefix, hole.suffix)
            if room is not None:  # the same window of the file for every configuration
                text = cut_to(hole.prefix, hole.suffix, room, target.count_tokens)
            for config in chosen:
                record = _complete(target, hole, text, config, index, budgets)
                if executor is not None and record.error is None:
                    record = _executed(executor, hole, record)
                report.records.append(record)
                if on_record is not None:
                    on_record(record)
                bar.update(1)
    except KeyboardInterrupt:
        report.metadata["interrupted"] = True
    finally:
        bar.close()
        if executor is not None:
            executor.close()
    return report


def _executor(index: RepoIndex | None, command: str, timeout: float) -> Executor:
    assert index is not None  # _index asked for repo=
    return Executor(index.root, command, timeout=timeout)


def _executed(executor: Executor, hole: Hole, record: HoleRecord) -> HoleRecord:
    """``record`` with whether its prediction passes CMD, if its hole's true middle does."""
    try:
        truth = executor.baseline(hole)
        if not truth.passed:
            status = TRUTH_TIMED_OUT if truth.status == TIMED_OUT else TRUTH_FAILS
            return dataclasses.replace(record, exec_status=status)
        run = executor.run(hole, record.prediction)
    except (InvalidParameterError, OSError) as exc:  # this hole's: recorded, the others still run
        return dataclasses.replace(record, exec_status=f"{NOT_RUN}: {exc}")
    return dataclasses.replace(record, passed=run.passed, exec_status=run.status, exec_s=run.seconds)


def _index(repo: Any, configs: list[Config], holes: list[Hole], command: str | None) -> RepoIndex | None:
    needs = [c.name for c in configs if c.repo_tokens is not None]
    if repo is None and command is not None:
        msg = "exec_command needs repo= (the repository's folder: its tests are run in a copy of it)."
        raise InvalidParameterError(msg)
    if repo is None:
        if needs and any(not h.context for h in holes):
            msg = (
                f"Configuration {needs[0]!r} needs repo= (the repository's folder or RepoIndex): its context."
            )
            raise InvalidParameterError(msg)
        return None
    return repo if isinstance(repo, RepoIndex) else RepoIndex(repo)


def _metadata(
    target: Any, configs: list[Config], holes: list[Hole], index: RepoIndex | None, budgets: dict[str, Any]
) -> dict[str, Any]:
    return {
        "target": type(target).__name__,
        "model": str(getattr(target, "name", "") or ""),
        "configs": [c.name for c in configs],
        "holes": len(holes),
        "repo": str(index.root) if index is not None else None,
        **budgets,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _complete(
    target: Any,
    hole: Hole,
    text: tuple[str, str],
    config: Config,
    index: RepoIndex | None,
    budgets: dict[str, Any],
) -> HoleRecord:
    """One hole under one configuration: its record, scored, or with the error that stopped it."""
    settings: dict[str, Any] = {"mode": config.mode, "end": config.end, "repo_tokens": config.repo_tokens}
    settings.update(budgets)
    fields = dict(task_id=hole.task_id, file=hole.file, kind=hole.kind, config=config.name, line=hole.line)
    fields.update(identifier=hole.identifier, settings=settings)
    try:
        started = time.perf_counter()  # the context lookup is part of what an editor waits for
        context = _context(target, hole, config, index)
        settings["context_files"] = [c.path for c in context]
        request = FIMRequest(
            text[0],
            text[1],
            context_files=context,
            file_path=hole.file,
            mode=config.mode,
            end=config.end,
            max_prompt_tokens=budgets["max_prompt_tokens"],
        )
        first: float | None = None
        texts, last = [], None
        stream = target.stream_infill(request, max_tokens=budgets["max_tokens"], cache_salt=config.name)
        try:
            for chunk in stream:
                if chunk.text and first is None:
                    first = time.perf_counter() - started
                texts.append(chunk.text)
                if chunk.finish_reason is not None:
                    last = chunk
        finally:  # Ctrl-C mid-stream cancels the generation at once, not when it is collected
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        total = time.perf_counter() - started
    except Exception as exc:  # this hole's failure: recorded, and the evaluation goes on
        return HoleRecord(
            **fields,
            language=hole.language,
            truth=hole.truth,
            prediction="",
            error=f"{type(exc).__name__}: {exc}",
        )
    raw = "".join(texts)
    prediction = cceval_truncate(hole.prefix, raw, hole.language) if hole.kind in POSTPROCESSED else raw
    return HoleRecord.scored(
        prediction,
        hole.truth,
        hole.language,
        **fields,
        raw=raw,
        ended=_ended(raw, hole.truth, last),
        first_token_s=first,
        total_s=total,
        prompt_tokens=getattr(last, "prompt_tokens", None),
        cached_tokens=getattr(last, "cached_tokens", None),
        completion_tokens=getattr(last, "completion_tokens", None),
    )


def _context(target: Any, hole: Hole, config: Config, index: RepoIndex | None) -> tuple[ContextFile, ...]:
    if config.repo_tokens is None:
        return ()
    if hole.context:  # given with the hole (CrossCodeEval's retrieved chunks)
        return hole.context
    assert index is not None  # _index asked for one
    files = index.context_files(
        hole.file, hole.prefix, hole.suffix, max_tokens=config.repo_tokens, count_tokens=target.count_tokens
    )
    return tuple(files)


def _ended(prediction: str, truth: str, last: Any) -> bool:
    """Whether the completion stopped by itself (not at ``max_tokens``) after as many lines as the truth."""
    stopped = getattr(last, "finish_reason", None) == "stop"
    return stopped and prediction.rstrip("\n").count("\n") == truth.rstrip("\n").count("\n")
