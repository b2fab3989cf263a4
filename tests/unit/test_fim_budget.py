"""One budget for FIM prompts: the engine, the HTTP server (/infill, /v1/completions with a suffix), the
Jupyter completer and ``build_fim_prompt(engine)`` send the same prompt ids for the same hole and
``max_tokens`` (each with its own default too), and none of them works the budget out but
:func:`langchain_starcoder.fim.budget.prompt_budget`.

A hole that just fits (its prompt is exactly the context window less ``max_tokens``) goes in whole on
every surface, one character more is cut; with ``prompt_budget`` shifted by a few tokens, every surface
cuts the hole that just fitted (a surface with a budget rule of its own would not).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from langchain_starcoder import ContextLengthError, FIMRequest, StarCoderEngine, build_fim_prompt
from langchain_starcoder.fim import budget
from langchain_starcoder.jupyter.completer import Completer, EngineSettings
from langchain_starcoder.jupyter.protocol import parse_ask
from langchain_starcoder.server import create_app
from langchain_starcoder.types import DEFAULT_MAX_TOKENS, GHOST_TEXT_MAX_TOKENS, GenerationParams

SUFFIX = "\n    return total\n"
CODE = "".join(f"value_{i} = compute({i}, scale={i % 7})\n" for i in range(600))
#: OpenAI's default max_tokens for the legacy completions endpoint, which the server keeps.
OPENAI_DEFAULT = 16
SHIFT = 5

#: A surface: (hole's prefix, max_tokens or None for its default) -> the prompt ids it sends.
Surface = Callable[[str, int | None], list[int]]


@pytest.fixture(scope="module")
def client(tiny_engine: StarCoderEngine) -> Iterator[TestClient]:
    with TestClient(create_app(tiny_engine, model_name="tiny")) as client:
        yield client


@pytest.fixture(scope="module")
def completer(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Completer]:
    completer = Completer(str(tmp_path_factory.mktemp("jupyter-root")), EngineSettings(model=str(tiny_path)))
    yield completer
    completer.close()


@pytest.fixture
def surfaces(tiny_engine, client, completer, backend_spy) -> dict[str, tuple[int, Surface]]:
    """Each surface with its default max_tokens: the prompt ids it sends for a hole."""
    sent = backend_spy(tiny_engine).prompts

    def sent_by(call: Callable[[], object]) -> list[int]:
        sent.clear()
        call()
        assert len(sent) == 1
        return sent[0]

    def engine_fim_prompt(prefix: str, max_tokens: int | None) -> list[int]:
        request = FIMRequest(prefix, SUFFIX)
        prompt = (
            tiny_engine.fim_prompt(request)
            if max_tokens is None
            else tiny_engine.fim_prompt(request, max_tokens)
        )
        return prompt.token_ids

    def engine_infill(prefix: str, max_tokens: int | None) -> list[int]:
        more = {} if max_tokens is None else {"max_tokens": max_tokens}
        return sent_by(lambda: tiny_engine.infill(prefix, SUFFIX, **more))

    def server_infill(prefix: str, max_tokens: int | None) -> list[int]:
        body = {"input_prefix": prefix, "input_suffix": SUFFIX, "cache_prompt": True, "n_probs": 0}
        body |= {} if max_tokens is None else {"n_predict": max_tokens}
        return sent_by(lambda: client.post("/infill", json=body).raise_for_status())

    def server_completions(prefix: str, max_tokens: int | None) -> list[int]:
        body = {"model": "tiny", "prompt": prefix, "suffix": SUFFIX, "temperature": 0}
        body |= {} if max_tokens is None else {"max_tokens": max_tokens}
        return sent_by(lambda: client.post("/v1/completions", json=body).raise_for_status())

    def jupyter(prefix: str, max_tokens: int | None) -> list[int]:
        body = {"prefix": prefix, "suffix": SUFFIX}
        body |= {} if max_tokens is None else {"max_tokens": max_tokens}
        return completer.prepare(parse_ask(body))[2].token_ids

    def built_with_the_engine(prefix: str, max_tokens: int | None) -> list[int]:
        assert max_tokens is None  # build_fim_prompt takes no max_tokens: its default only
        return build_fim_prompt(tiny_engine, prefix, SUFFIX).token_ids

    return {
        "engine.fim_prompt": (GenerationParams.max_tokens, engine_fim_prompt),
        "engine.infill": (GenerationParams.max_tokens, engine_infill),
        "server /infill": (DEFAULT_MAX_TOKENS, server_infill),
        "server /v1/completions": (OPENAI_DEFAULT, server_completions),
        "jupyter completer": (GHOST_TEXT_MAX_TOKENS, jupyter),
        "build_fim_prompt(engine)": (DEFAULT_MAX_TOKENS, built_with_the_engine),
    }


def just_fitting(tokenizer: object, tokens: int) -> str:
    """An end of CODE whose prompt (before SUFFIX) is exactly ``tokens`` long, one character more
    making it ``tokens + 1``: so a budget that keeps it whole and cuts the longer one is ``tokens``."""

    def size(chars: int) -> int:
        return len(build_fim_prompt(tokenizer, CODE[len(CODE) - chars :], SUFFIX).token_ids)

    lo, hi = 0, len(CODE)  # size(lo) <= tokens < size(hi)
    assert size(hi) > tokens
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if size(mid) <= tokens else (lo, mid)
    for chars in range(lo, 0, -1):  # the nearest end whose next character adds exactly one token
        if size(chars) == tokens and size(chars + 1) == tokens + 1:
            return CODE[len(CODE) - chars :]
    raise AssertionError("no end of CODE is exactly that long")


def one_more(prefix: str) -> str:
    return CODE[len(CODE) - len(prefix) - 1 :]


SURFACES = [
    "engine.fim_prompt",
    "engine.infill",
    "server /infill",
    "server /v1/completions",
    "jupyter completer",
    "build_fim_prompt(engine)",
]
# Each surface with its default max_tokens, and each that takes one with max_tokens=40 (build_fim_prompt
# takes none: only its default applies).
CASES = [(name, None) for name in SURFACES] + [(name, 40) for name in SURFACES[:-1]]


@pytest.mark.parametrize(
    ("name", "explicit"), CASES, ids=[f"{n}, max_tokens={m or 'default'}" for n, m in CASES]
)
def test_every_surface_sends_the_engines_prompt_in_the_windows_budget(
    tiny_engine: StarCoderEngine, surfaces, name: str, explicit: int | None
) -> None:
    default, surface = surfaces[name]
    max_tokens = default if explicit is None else explicit
    room = tiny_engine.context_window - max_tokens
    fits = just_fitting(tiny_engine.tokenizer, room)
    whole = tiny_engine.fim_prompt(FIMRequest(fits, SUFFIX), max_tokens)
    assert whole.prefix_chars_kept == len(fits) and len(whole.token_ids) == room
    assert surface(fits, explicit) == whole.token_ids
    cut = tiny_engine.fim_prompt(FIMRequest(one_more(fits), SUFFIX), max_tokens)
    assert cut.prefix_chars_kept < len(fits) + 1 and len(cut.token_ids) <= room
    assert surface(one_more(fits), explicit) == cut.token_ids


@pytest.mark.parametrize("name", SURFACES)
def test_no_surface_works_out_a_budget_of_its_own(
    tiny_engine: StarCoderEngine, surfaces, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    default, surface = surfaces[name]
    room = tiny_engine.context_window - default
    fits = just_fitting(tiny_engine.tokenizer, room)
    real, calls = budget.prompt_budget, []

    def shifted(context_window: int, max_tokens: int, max_prompt_tokens: int | None) -> int:
        calls.append((context_window, max_tokens, max_prompt_tokens))
        return real(context_window, max_tokens, max_prompt_tokens) - SHIFT

    monkeypatch.setattr(budget, "prompt_budget", shifted)
    ids = surface(fits, None)
    assert (tiny_engine.context_window, default, None) in calls  # the surface's default, given to it
    assert len(ids) <= room - SHIFT  # the hole that just fitted is cut to the one rule's budget
    assert (
        ids == build_fim_prompt(tiny_engine.tokenizer, fits, SUFFIX, max_prompt_tokens=room - SHIFT).token_ids
    )


def test_the_budget_rule() -> None:
    assert budget.prompt_budget(2048, 256, None) == 1792
    assert budget.prompt_budget(2048, 256, 1000) == 1000
    assert budget.prompt_budget(2048, 48, 2000) == 2000  # the two exactly fill the window
    with pytest.raises(ContextLengthError, match="max_tokens=2048 leaves no room for a prompt"):
        budget.prompt_budget(2048, 2048, None)
    with pytest.raises(ContextLengthError, match="max_prompt_tokens=2000 plus max_tokens=49 exceeds"):
        budget.prompt_budget(2048, 49, 2000)
