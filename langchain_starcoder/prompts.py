"""``FIMPromptTemplate``: fill-in-the-middle prompts for LangChain chains, with user text kept as data.

LangChain hands an LLM its prompt as a string (``PromptValue.to_string()``), and a string prompt is
tokenized with control tokens parsed. A FIM prompt built that way would let a file holding the
literal text ``<file_sep>`` or ``<|endoftext|>`` reshape or end the prompt. So the template's
prompt value turns into :class:`FIMText`: a ``str`` (the FIM layout as readable text, for traces,
caches and other LLMs) that also carries the parts, from which ``StarCoderLLM`` builds the prompt
ids with the parts encoded as data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.prompt_values import PromptValue
from langchain_core.prompts import StringPromptTemplate
from pydantic import Field

from .errors import InvalidParameterError
from .fim import ContextFile


@dataclass(frozen=True)
class FIMRequest:
    """The parts of one fill-in-the-middle request (the arguments of ``StarCoderEngine.infill``)."""

    prefix: str
    suffix: str = ""
    context_files: tuple[ContextFile, ...] = ()
    repo_name: str | None = None
    file_path: str | None = None
    mode: str = "psm"
    max_prompt_tokens: int | None = None
    trim_suffix_overlap: bool = True

    def __post_init__(self) -> None:
        for name in ("prefix", "suffix"):
            if not isinstance(getattr(self, name), str):
                msg = f"The FIM {name} must be text (str), not {type(getattr(self, name)).__name__}."
                raise InvalidParameterError(msg)
        for name in ("repo_name", "file_path"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                msg = f"{name} must be text (str) or None, not {type(value).__name__}."
                raise InvalidParameterError(msg)

    def prompt_kwargs(self) -> dict[str, Any]:
        """Keywords of ``build_fim_prompt`` (after the engine)."""
        return {
            "prefix": self.prefix,
            "suffix": self.suffix,
            "context_files": self.context_files,
            "repo_name": self.repo_name,
            "file_path": self.file_path,
            "mode": self.mode,
            "max_prompt_tokens": self.max_prompt_tokens,
        }

    def infill_kwargs(self) -> dict[str, Any]:
        """Keywords of ``StarCoderEngine.infill`` (without the generation settings)."""
        return {**self.prompt_kwargs(), "trim_suffix_overlap": self.trim_suffix_overlap}

    def render(self) -> str:
        """The FIM layout as text, control tokens written out (what traces and caches show)."""
        return render_fim_text(**self.prompt_kwargs())


def render_fim_text(
    prefix: str,
    suffix: str = "",
    *,
    context_files: Iterable[ContextFile] = (),
    repo_name: str | None = None,
    file_path: str | None = None,
    mode: str = "psm",
    max_prompt_tokens: int | None = None,
) -> str:
    """The FIM layout of ``build_fim_prompt`` as plain text, untruncated (a budget needs a tokenizer)."""
    files = list(context_files)
    header = f"{file_path}\n" if file_path else ""
    if mode == "spm":
        hole = f"<fim_prefix><fim_suffix>{suffix}<fim_middle>{header}{prefix}"
    else:
        hole = f"<fim_prefix>{header}{prefix}<fim_suffix>{suffix}<fim_middle>"
    if not (files or repo_name or file_path):
        return hole
    head = f"<repo_name>{repo_name}" if repo_name else ""
    body = "".join(f"<file_sep>{f.path}\n{f.text}" if f.path else f"<file_sep>{f.text}" for f in files)
    return f"{head}{body}<file_sep>{hole}"


class FIMText(str):
    """A FIM prompt as text that remembers its parts, so ``StarCoderLLM`` can encode them as data.

    It is an ordinary ``str`` for everyone else (tracers, caches, other LLMs see the layout text).
    """

    fim: FIMRequest

    def __new__(cls, request: FIMRequest) -> FIMText:
        text = super().__new__(cls, request.render())
        text.fim = request
        return text

    def __reduce__(self) -> tuple[Any, ...]:
        return (FIMText, (self.fim,))


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


class FIMPromptValue(PromptValue):
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
    type: Literal["FIMPromptValue"] = "FIMPromptValue"

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        return ["langchain_starcoder", "prompts"]

    @classmethod
    def from_request(cls, request: FIMRequest) -> FIMPromptValue:
        data = asdict(request)
        data["context_files"] = [(f.path, f.text) for f in request.context_files]
        return cls(**data)

    def request(self) -> FIMRequest:
        return FIMRequest(
            prefix=self.prefix,
            suffix=self.suffix,
            context_files=tuple(ContextFile(p, t) for p, t in self.context_files),
            repo_name=self.repo_name,
            file_path=self.file_path,
            mode=self.mode,
            max_prompt_tokens=self.max_prompt_tokens,
            trim_suffix_overlap=self.trim_suffix_overlap,
        )

    def to_string(self) -> str:
        return FIMText(self.request())

    def to_messages(self) -> list[BaseMessage]:
        return [HumanMessage(content=str(self.to_string()))]


class FIMPromptTemplate(StringPromptTemplate):
    """A prompt template for fill-in-the-middle: ``FIMPromptTemplate() | StarCoderLLM(...)`` returns
    the middle only.

    Input variables: ``prefix`` and ``suffix`` (required), ``context_files`` (a list of
    ``ContextFile``, ``(path, text)`` pairs or LangChain ``Document``s), ``file_path`` and
    ``repo_name`` (optional; any of them can be fixed with ``.partial(...)``). All of them are
    data: a file that holds the literal text ``<file_sep>`` or ``<|endoftext|>`` cannot reshape
    or end the prompt.

    Setup:
        .. code-block:: bash

            pip install langchain-starcoder

    Key init args:
        mode: str
            "psm" (default) or "spm".
        max_prompt_tokens: int | None
            Token budget of the prompt; the engine trims context files, then prefix and suffix.
        trim_suffix_overlap: bool
            Drop the end of the middle that repeats the start of the suffix (default True).

    Instantiate:
        .. code-block:: python

            from langchain_starcoder import FIMPromptTemplate, StarCoderLLM

            chain = FIMPromptTemplate() | StarCoderLLM(max_tokens=64)

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

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        return ["langchain_starcoder", "prompts"]

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
        )

    def format(self, **kwargs: Any) -> str:
        """The prompt as :class:`FIMText` (a ``str`` that keeps the parts)."""
        return FIMText(self._request(**kwargs))

    def format_prompt(self, **kwargs: Any) -> PromptValue:
        return FIMPromptValue.from_request(self._request(**kwargs))

    async def aformat_prompt(self, **kwargs: Any) -> PromptValue:
        return self.format_prompt(**kwargs)
