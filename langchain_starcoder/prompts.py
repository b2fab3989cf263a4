"""Prompt templates for LangChain chains whose variables stay data all the way to the token ids.

LangChain hands an LLM its prompt as a string (``PromptValue.to_string()``), and a string prompt is
tokenized with control tokens parsed. A prompt built that way would let a retrieved file holding
the literal text ``<file_sep>`` or ``<|endoftext|>`` reshape or end the prompt. So these templates'
prompt values turn into :class:`CarriedText`: a ``str`` (the prompt as readable text, for traces,
caches and other LLMs) that also carries its parts, from which ``StarCoderLLM`` builds the prompt
ids with the variables encoded as data.

The parts do not depend on that ``str`` subclass surviving: every string operation returns a plain
``str``. Each formatted prompt is also kept, by its text, in a bounded side table, and
:func:`carried` finds the parts of any string: the prompt itself, a copy of the same value
(``str(t)``, ``f"{t}"``, ``t.strip()``, a round trip through JSON), or a text that holds formatted
prompts among other text (``t + "..."``: their parts stay data, the rest is hand-written).

- :class:`FIMPromptTemplate`: fill in the middle (:class:`FIMText` carries a ``FIMRequest``).
- :class:`StarCoderPromptTemplate`: a drop-in ``PromptTemplate``; its own template text may hold
  control tokens, its variables are data (:class:`TemplateText` carries the segments).
"""

from __future__ import annotations

import hashlib
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import fields
from string import Formatter
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.prompt_values import PromptValue
from langchain_core.prompts import PromptTemplate, StringPromptTemplate
from pydantic import Field, model_validator

from .errors import InvalidParameterError
from .fim.request import FIM_KEYS, ContextFile, FIMRequest
from .notebook.cells import NotebookCell, NotebookContext

if TYPE_CHECKING:
    from typing_extensions import Self

    from .engine import StarCoderEngine


Segments = tuple[tuple[str, bool], ...]
"""A prompt in pieces: ``(text, is_data)``; data never becomes control tokens."""


def render_fim_text(request: FIMRequest) -> str:
    """The FIM layout of ``build_fim_prompt`` as plain text, untruncated (a budget needs a tokenizer)."""
    return "".join(text for text, _ in fim_segments(request))


def fim_segments(request: FIMRequest) -> Segments:
    """:func:`render_fim_text` in pieces: the layout's control tokens are template text, every part
    of the request (prefix, suffix, files, names, cells) is data."""
    header = _data(f"{request.file_path}\n" if request.file_path else "")
    prefix, suffix = _data(request.prefix), _data(request.suffix)
    if request.notebook is not None:
        before, after = _notebook_segments(request.notebook)
        header, suffix = header + before, suffix + after
    if request.mode == "spm":
        hole = [_control("<fim_prefix>"), _control("<fim_suffix>"), *suffix, _control("<fim_middle>")]
        hole += [*header, *prefix]
    else:
        hole = [_control("<fim_prefix>"), *header, *prefix, _control("<fim_suffix>"), *suffix]
        hole.append(_control("<fim_middle>"))
    if not request.repo_level:
        return tuple(hole)
    head = [_control("<repo_name>"), *_data(request.repo_name or "")] if request.repo_name else []
    for f in request.context_files:
        head += [_control("<file_sep>"), *_data(f"{f.path}\n{f.text}" if f.path else f.text)]
    return (*head, _control("<file_sep>"), *hole)


def _control(token: str) -> tuple[str, bool]:
    return (token, False)


def _data(text: str) -> list[tuple[str, bool]]:
    return [(text, True)] if text else []


def _notebook_segments(ctx: NotebookContext) -> tuple[list[tuple[str, bool]], list[tuple[str, bool]]]:
    """The notebook around the hole, unbudgeted: what goes before the hole cell's prefix
    (``<jupyter_start>`` ... ``<jupyter_code>``) and after its suffix; sources and outputs are data."""

    def output(text: str) -> list[tuple[str, bool]]:
        return [_control("<jupyter_output>"), *(_data(text) or [_control("<empty_output>")])]

    def cell(c: NotebookCell) -> list[tuple[str, bool]]:
        if c.kind == "markdown":
            return [_control("<jupyter_text>"), *_data(c.source)]
        return [_control("<jupyter_code>"), *_data(c.source), *output(c.output)]

    before = [part for c in ctx.cells[: ctx.cell] for part in cell(c)]
    after = [part for c in ctx.cells[ctx.cell + 1 :] for part in cell(c)]
    return [_control("<jupyter_start>"), *before, _control("<jupyter_code>")], output(ctx.hole_output) + after


class CarriedText(str):
    """A prompt as text that also carries how to encode it exactly (its parts that are data).

    It is an ordinary ``str`` for everyone else (tracers, caches, other LLMs see the text). Each is
    kept by its text in a bounded side table, so a plain ``str`` copy keeps its parts too:
    :func:`carried`.
    """

    def pieces(self) -> Segments:
        """The prompt in pieces ``(text, is_data)``: what a text that holds it keeps of it."""
        raise NotImplementedError

    def prompt_value(self) -> PromptValue:
        """The prompt value this text came from (so ``llm.invoke(text)`` keeps the parts)."""
        raise NotImplementedError

    def cache_key(self) -> str:
        """What, beyond the text, decides the prompt's token ids (for LangChain's LLM cache)."""
        raise NotImplementedError


class FIMText(CarriedText):
    """A FIM prompt as text that remembers its request, so ``StarCoderLLM`` encodes its parts as data."""

    fim: FIMRequest

    def __new__(cls, request: FIMRequest) -> FIMText:
        text = super().__new__(cls, render_fim_text(request))
        text.fim = request
        _FORMATTED.add(text)
        return text

    def __reduce__(self) -> tuple[Any, ...]:
        return (FIMText, (self.fim,))

    def pieces(self) -> Segments:
        return fim_segments(self.fim)

    def prompt_value(self) -> PromptValue:
        return FIMPromptValue.from_request(self.fim)

    def cache_key(self) -> str:
        f = self.fim
        if f.repo is not None:  # the context is read from the repository at generation time
            return f"fim:repo:{uuid.uuid4().hex}"  # so no cached answer stands for it
        parts = (f.prefix, f.suffix, f.repo_name or "", f.file_path or "")
        parts += tuple(x for file in f.context_files for x in (file.path, file.text))
        key = f"fim:{f.max_prompt_tokens}:{f.trim_suffix_overlap}:{f.end}:{f.min_indent}"
        if f.notebook is not None:  # cells and outputs may spell control tokens: key them exactly
            return f"{key}:" + _digest((f, f.notebook))
        return key + _exact(parts, f)


# Text that may be a control token in some vocabulary (``<file_sep>``, ``<|endoftext|>``, ``<fim-prefix>``).
_CONTROL_LIKE = re.compile(r"<\|?[\w-]+\|?>")


def _digest(value: Any) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()


def _exact(data: Iterable[str], whole: Any) -> str:
    """ "" when the rendered text says it all, else a digest of ``whole``: a data part that holds
    control-token text renders like template text that writes the token, yet encodes otherwise.
    Ordinary prompts keep one key per setting, so a prompt asked alone and in a batch is one entry."""
    if not any(_CONTROL_LIKE.search(text) for text in data):
        return ""
    return ":" + _digest(whole)


class TemplateText(CarriedText):
    """A ``StarCoderPromptTemplate`` prompt: template text (control tokens parsed) and data."""

    segments: Segments

    def __new__(cls, segments: Iterable[tuple[str, bool]], *, _keep: bool = True) -> TemplateText:
        parts = tuple((str(t), bool(d)) for t, d in segments)
        text = super().__new__(cls, "".join(t for t, _ in parts))
        text.segments = parts
        if _keep:
            _FORMATTED.add(text)
        return text

    def __reduce__(self) -> tuple[Any, ...]:
        return (TemplateText, (self.segments,))

    def pieces(self) -> Segments:
        return self.segments

    def prompt_value(self) -> PromptValue:
        return TemplatePromptValue(segments=list(self.segments))

    def cache_key(self) -> str:
        return "template" + _exact([text for text, is_data in self.segments if is_data], self.segments)

    def token_ids(self, engine: StarCoderEngine, *, check_size: bool = True) -> list[int]:
        return engine.encode_segments(self.segments, check_size=check_size)


# --- the formatted prompts, by their text ---------------------------------------------------------

#: How many formatted prompts, and how many characters of them, the side table keeps (the oldest go).
MAX_KEPT_PROMPTS = 256
MAX_KEPT_CHARS = 8_000_000


class _Formatted:
    """The prompts these templates formatted lately, by their text (bounded, oldest out first).

    A prompt whose data spells control tokens is *hostile*: only there does a text that holds it
    encode otherwise than its plain parse, so only those are looked for inside longer texts.
    """

    def __init__(self, max_prompts: int, max_chars: int) -> None:
        self._max_prompts, self._max_chars = max_prompts, max_chars
        self._by_text: OrderedDict[str, CarriedText] = OrderedDict()  # the key is the prompt itself
        self._hostile: set[str] = set()
        self._chars = 0
        self._lock = threading.Lock()

    def add(self, prompt: CarriedText) -> None:
        """Keep ``prompt`` as the parts of its text. Another prompt of the same text with other parts
        (a variable's value that equals another template's own text) leaves the safer of both: data
        wherever either has data."""
        with self._lock:
            existing = self._by_text.pop(prompt, None)
            if existing is not None:
                self._chars -= len(existing)
                self._hostile.discard(existing)
                if existing is not prompt and existing.pieces() != prompt.pieces():
                    prompt = _safer(existing, prompt)
            self._by_text[prompt] = prompt
            self._chars += len(prompt)
            if any(is_data and _CONTROL_LIKE.search(text) for text, is_data in prompt.pieces()):
                self._hostile.add(prompt)
            while len(self._by_text) > self._max_prompts or self._chars > self._max_chars:
                _, old = self._by_text.popitem(last=False)
                self._chars -= len(old)
                self._hostile.discard(old)

    def get(self, text: str) -> CarriedText | None:
        with self._lock:
            return self._by_text.get(text)

    def held_in(self, text: str) -> list[tuple[int, int, CarriedText]]:
        """Where ``text`` holds hostile prompts (each less the whitespace at its ends, as
        ``strip`` leaves it), without overlaps, in order: ``(start, end, prompt)``."""
        with self._lock:
            hostile = [p for p in reversed(self._by_text) if p in self._hostile]  # the newest first
        spans: list[tuple[int, int, CarriedText]] = []
        for prompt in hostile:
            core = prompt.strip()
            start = text.find(core)
            while core and start >= 0:
                end = start + len(core)
                if all(end <= s or start >= e for s, e, _ in spans):
                    spans.append((start, end, prompt))
                start = text.find(core, end)
        return sorted(spans, key=lambda span: span[0])


_FORMATTED = _Formatted(MAX_KEPT_PROMPTS, MAX_KEPT_CHARS)


def carried(text: str) -> CarriedText | None:
    """The prompt with parts that ``text`` is, whatever string operations it went through.

    ``text`` itself if it kept its type; else the prompt these templates formatted last with the same
    text (``str(t)``, ``f"{t}"``, ``t.strip()``, ``json.loads(json.dumps(t))``...; two of the same text
    whose parts differ leave data wherever either has it); else, for a text
    that holds such prompts among other text (``t + "..."``, ``f"# {t}"``), a :class:`TemplateText`
    in which their parts stay data and the rest is hand-written. None: no template formatted it (a
    hand-written prompt), or nothing in it could be a control token.
    """
    if isinstance(text, CarriedText):
        return text
    if not isinstance(text, str):
        return None
    found = _FORMATTED.get(text)
    if found is not None or not _CONTROL_LIKE.search(text):
        return found
    spans = _FORMATTED.held_in(text)
    if not spans:
        return None
    segments: list[tuple[str, bool]] = []
    at = 0
    for start, end, prompt in spans:
        segments += [(text[at:start], False), *_core_pieces(prompt)]
        at = end
    return TemplateText([*segments, (text[at:], False)])


def _safer(older: CarriedText, newer: CarriedText) -> CarriedText:
    """``newer``, unless ``older`` (of the same text) has data where it has not: then the text with
    data wherever either has it."""
    data = [a or b for a, b in zip(_data_mask(older), _data_mask(newer), strict=True)]
    if data == _data_mask(newer):
        return newer
    segments, start = [], 0
    for i in range(1, len(data) + 1):
        if i == len(data) or data[i] != data[start]:
            segments.append((newer[start:i], data[start]))
            start = i
    return TemplateText(segments, _keep=False)


def _data_mask(prompt: CarriedText) -> list[bool]:
    return [is_data for text, is_data in prompt.pieces() for _ in text]


def _core_pieces(prompt: CarriedText) -> list[tuple[str, bool]]:
    """The pieces of ``prompt`` less the whitespace at its ends."""
    lo, hi = len(prompt) - len(prompt.lstrip()), len(prompt.rstrip())
    out, at = [], 0
    for text, is_data in prompt.pieces():
        start, end = max(lo, at), min(hi, at + len(text))
        if start < end:
            out.append((text[start - at : end - at], is_data))
        at += len(text)
    return out


def to_context_files(files: Any) -> tuple[ContextFile, ...]:
    """``ContextFile``s from ``ContextFile``s, ``(path, text)`` pairs, ``{"path", "text"}`` dicts or
    LangChain ``Document``s (path from ``metadata["path"]`` or ``metadata["source"]``)."""
    if files is None:
        return ()
    if isinstance(files, str | bytes | Mapping) or not isinstance(files, Iterable):
        msg = "context_files must be a list of ContextFile, (path, text) pairs or Documents."
        raise InvalidParameterError(msg)
    out = []
    for item in files:
        if isinstance(item, ContextFile):
            out.append(item)
        elif isinstance(item, Mapping) and "text" in item:
            out.append(ContextFile(str(item.get("path", "")), item["text"]))
        elif hasattr(item, "page_content") and hasattr(item, "metadata"):
            meta = item.metadata or {}
            out.append(ContextFile(str(meta.get("path") or meta.get("source") or ""), item.page_content))
        elif isinstance(item, tuple | list) and len(item) == 2:
            out.append(ContextFile(str(item[0]), item[1]))
        else:
            msg = f"A context file is a ContextFile, a (path, text) pair or a Document, not {item!r:.80}."
            raise InvalidParameterError(msg)
    for f in out:
        if not isinstance(f.text, str):
            msg = f"The text of context file {f.path!r} must be str, not {type(f.text).__name__}."
            raise InvalidParameterError(msg)
    return tuple(out)


class _InPrompts:
    """Where LangChain's ``load`` finds these classes."""

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        return ["langchain_starcoder", "prompts"]


class FIMPromptValue(_InPrompts, PromptValue):
    """A fill-in-the-middle prompt. ``to_string()`` gives a :class:`FIMText`."""

    prefix: str
    """Code before the hole."""
    suffix: str = ""
    """Code after the hole."""
    context_files: list[tuple[str, str]] = Field(default_factory=list)
    """Related files as ``(path, text)`` pairs, put before the hole's file."""
    repo_name: str | None = None
    """The repository's name (StarCoder2's repository-level format)."""
    file_path: str | None = None
    """The path of the file with the hole."""
    mode: str = "psm"
    """FIM layout: "psm" (prefix, suffix, middle) or "spm"."""
    max_prompt_tokens: int | None = None
    """Token budget of the prompt; the engine trims the parts to fit."""
    trim_suffix_overlap: bool = True
    """Drop the end of the middle that repeats the start of the suffix."""
    end: Literal["auto", "line", "block", "none"] = "auto"
    """Where decoding stops once the hole is filled (see ``FIMRequest.end``)."""
    min_indent: int = 0
    """A later line indented less than this ends the middle (llama.cpp's ``n_indent``); 0: off."""
    repo: Any = Field(default=None, exclude=True)
    """A ``RepoIndex`` that picks the context files for ``file_path`` when none are given."""
    notebook: Any = Field(default=None, exclude=True)
    """A ``NotebookContext``: the hole is in one of its code cells."""
    type: Literal["FIMPromptValue"] = "FIMPromptValue"

    @classmethod
    def from_request(cls, request: FIMRequest) -> FIMPromptValue:
        data = {f.name: getattr(request, f.name) for f in fields(FIMRequest)}
        data["context_files"] = [(f.path, f.text) for f in request.context_files]
        return cls(**data)

    def request(self) -> FIMRequest:
        values = {f.name: getattr(self, f.name) for f in fields(FIMRequest)}
        return FIMRequest(**values)

    def to_string(self) -> str:
        return FIMText(self.request())

    def to_messages(self) -> list[BaseMessage]:
        return [HumanMessage(content=str(self.to_string()))]


class FIMPromptTemplate(_InPrompts, StringPromptTemplate):
    """A prompt template for fill-in-the-middle: ``FIMPromptTemplate() | StarCoderLLM(...)`` returns
    the middle only.

    Input variables: ``prefix`` and ``suffix`` (required), ``context_files`` (a list of
    ``ContextFile``, ``(path, text)`` pairs or LangChain ``Document``s), ``file_path`` and
    ``repo_name`` (optional; any of them can be fixed with ``.partial(...)``). All of them are
    data: a file that holds the literal text ``<file_sep>`` or ``<|endoftext|>`` cannot reshape
    or end the prompt.

    Setup:
        .. code-block:: bash

            pip install -e .  # in a checkout of this repository: the package is not on PyPI yet

    Key init args:
        mode: str
            "psm" (default) or "spm".
        max_prompt_tokens: int | None
            Token budget of the prompt; the engine trims context files, then prefix and suffix.
        trim_suffix_overlap: bool
            Drop the end of the middle that repeats the start of the suffix (default True).
        end: str
            "auto" (default: stop where the code says the hole is filled), "line", "block" or "none".
        repo: RepoIndex | None
            Repository context: the index picks the related code of ``file_path`` (a required
            input then) within the budget the hole leaves; given ``context_files`` win.

    Instantiate:
        .. code-block:: python

            from langchain_starcoder import FIMPromptTemplate, RepoIndex, StarCoderLLM

            chain = FIMPromptTemplate() | StarCoderLLM(max_tokens=64)
            repo_chain = FIMPromptTemplate(repo=RepoIndex(".")) | StarCoderLLM(max_tokens=64)

    Invoke:
        .. code-block:: python

            middle = chain.invoke({"prefix": "def area(r):\\n    return ", "suffix": "\\n"})
            chain.invoke({
                "prefix": "from utils import slugify\\n\\ntitle = ",
                "suffix": "\\n",
                "context_files": [("utils.py", open("utils.py").read())],
                "file_path": "main.py",
                "repo_name": "blog",
            })

    Stream:
        .. code-block:: python

            for piece in chain.stream({"prefix": "def add(a, b):\\n", "suffix": ""}):
                print(piece, end="")

    Async:
        .. code-block:: python

            middle = await chain.ainvoke({"prefix": "def add(a, b):\\n", "suffix": ""})
    """

    input_variables: list[str] = Field(default_factory=lambda: ["prefix", "suffix"])
    """Required inputs: the code before and after the hole."""

    optional_variables: list[str] = Field(default_factory=lambda: ["context_files", "file_path", "repo_name"])
    """Optional inputs: related files, the hole's file path and the repository name."""

    input_types: dict[str, Any] = Field(
        default_factory=lambda: {"context_files": list, "file_path": str, "repo_name": str}, exclude=True
    )
    """Types of the inputs (for the input schema)."""

    mode: Literal["psm", "spm"] = "psm"
    """FIM layout: "psm" (prefix, suffix, middle) or "spm" (suffix, prefix, middle)."""

    max_prompt_tokens: int | None = Field(default=None, ge=1)
    """Token budget of the prompt (None: the model's context minus ``max_tokens``)."""

    trim_suffix_overlap: bool = True
    """Drop the end of the middle that repeats the start of the suffix."""

    end: Literal["auto", "line", "block", "none"] = "auto"
    """Where decoding stops once the hole is filled: "auto" (where the code says it is complete),
    "line", "block" or "none" (see :func:`~langchain_starcoder.middle_end`)."""

    repo: Any = Field(default=None, exclude=True)
    """A :class:`~langchain_starcoder.RepoIndex`: the LLM fills the budget the hole's file leaves with
    the index's context for ``file_path`` (which then is required), unless ``context_files`` are given."""

    @property
    def _prompt_type(self) -> str:
        return "starcoder-fim"

    def _request(self, **kwargs: Any) -> FIMRequest:
        # Other keys are ignored, as LangChain's templates do (chains pass whole dicts along).
        values = self._merge_partial_and_user_variables(**kwargs)
        return FIMRequest(
            prefix=values["prefix"],
            suffix=values.get("suffix", ""),
            context_files=to_context_files(values.get("context_files")),
            repo_name=values.get("repo_name"),
            file_path=values.get("file_path"),
            mode=self.mode,
            max_prompt_tokens=self.max_prompt_tokens,
            trim_suffix_overlap=self.trim_suffix_overlap,
            end=self.end,
            repo=self.repo,
        )

    def format(self, **kwargs: Any) -> str:
        """The prompt as :class:`FIMText` (a ``str`` that keeps the parts)."""
        return FIMText(self._request(**kwargs))

    def format_prompt(self, **kwargs: Any) -> PromptValue:
        return FIMPromptValue.from_request(self._request(**kwargs))

    async def aformat_prompt(self, **kwargs: Any) -> PromptValue:
        return self.format_prompt(**kwargs)


def fim_value(prefix: str | FIMRequest, suffix: str, kwargs: dict[str, Any]) -> tuple[FIMPromptValue, dict]:
    """The prompt value of an infill call (a ``FIMRequest``, or its fields among ``kwargs``) and
    the remaining keyword arguments (generation settings)."""
    options = {k: kwargs.pop(k) for k in FIM_KEYS if k in kwargs}
    if isinstance(prefix, FIMRequest):
        if options or suffix:
            msg = "Pass either a FIMRequest or its fields as arguments, not both."
            raise InvalidParameterError(msg)
        return FIMPromptValue.from_request(prefix), kwargs
    options["context_files"] = to_context_files(options.get("context_files"))
    return FIMPromptValue.from_request(FIMRequest(prefix, suffix, **options)), kwargs


class TemplatePromptValue(_InPrompts, PromptValue):
    """A ``StarCoderPromptTemplate`` prompt. ``to_string()`` gives a :class:`TemplateText`."""

    segments: list[tuple[str, bool]]
    """The prompt in pieces ``(text, is_data)``."""
    type: Literal["StarCoderTemplatePromptValue"] = "StarCoderTemplatePromptValue"

    def to_string(self) -> str:
        return TemplateText(self.segments)

    def to_messages(self) -> list[BaseMessage]:
        return [HumanMessage(content=str(self.to_string()))]


class StarCoderPromptTemplate(_InPrompts, PromptTemplate):
    """A drop-in ``PromptTemplate`` whose variables are data: control-token strings in them
    (``<|endoftext|>``, ``<file_sep>``...) stay plain text, while the template's own text may hold
    control tokens, as hand-written prompts do.

    With ``StarCoderLLM`` the prompt reaches the model exactly so; for any other LLM it is the
    ordinary formatted string. f-string templates only (the default format).

    Setup:
        .. code-block:: bash

            pip install -e .  # in a checkout of this repository: the package is not on PyPI yet

    Instantiate:
        .. code-block:: python

            from langchain_starcoder import StarCoderLLM, StarCoderPromptTemplate

            prompt = StarCoderPromptTemplate.from_template("<file_sep>{path}\\n{code}<file_sep>notes.md\\n")
            chain = prompt | StarCoderLLM(max_tokens=64)

    Invoke, stream, async (as any runnable; a file that quotes ``<|endoftext|>`` stays text):
        .. code-block:: python

            chain.invoke({"path": "utils.py", "code": open("utils.py").read()})
            print("".join(chain.stream({"path": "a.py", "code": "print('<|endoftext|>')"})))
            await chain.ainvoke({"path": "a.py", "code": "x = 1\\n"})
    """

    @model_validator(mode="after")
    def _f_string_only(self) -> Self:
        if self.template_format != "f-string":
            msg = (
                f"StarCoderPromptTemplate takes f-string templates, not {self.template_format!r}: "
                "only there can it tell the template's text from the variables."
            )
            raise ValueError(msg)
        return self

    def __add__(self, other: Any) -> StarCoderPromptTemplate:
        """``self + other`` (a template or f-string text), as LangChain joins templates, staying a
        ``StarCoderPromptTemplate``: every variable of both is data."""
        return _joined(self, other)

    def __radd__(self, other: Any) -> StarCoderPromptTemplate:
        """``other + self``: text, or a plain ``PromptTemplate`` (Python asks the subclass first)."""
        if not isinstance(other, str | PromptTemplate):
            return NotImplemented
        return _joined(other, self)

    def segments(self, **kwargs: Any) -> Segments:
        """The prompt for these variables in pieces ``(text, is_data)``."""
        values = self._merge_partial_and_user_variables(**kwargs)
        formatter = Formatter()
        out: list[tuple[str, bool]] = []
        for literal, field, spec, conversion in formatter.parse(self.template):
            if literal:
                out.append((literal, False))
            if field is not None:
                value, _ = formatter.get_field(field, (), values)
                value = formatter.convert_field(value, conversion)
                out.append((formatter.format_field(value, spec or ""), True))
        return tuple(out)

    def format(self, **kwargs: Any) -> str:
        """The prompt as :class:`TemplateText` (a ``str`` that keeps its pieces)."""
        return TemplateText(self.segments(**kwargs))

    def format_prompt(self, **kwargs: Any) -> PromptValue:
        return TemplatePromptValue(segments=list(self.segments(**kwargs)))

    async def aformat_prompt(self, **kwargs: Any) -> PromptValue:
        return self.format_prompt(**kwargs)


def _joined(left: str | PromptTemplate, right: Any) -> StarCoderPromptTemplate:
    """``left + right`` by LangChain's rules (one format, no variable partialed twice), as a
    ``StarCoderPromptTemplate``: a plain ``PromptTemplate`` would format the variables into text
    that is then parsed for control tokens."""
    if isinstance(left, str):
        left = StarCoderPromptTemplate.from_template(left)
    joined = PromptTemplate.__add__(left, right)
    return StarCoderPromptTemplate(**joined.__dict__)
