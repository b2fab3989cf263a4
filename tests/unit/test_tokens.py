"""What a token is: one definition of a control token, and how much text a token can stand for.

Control tokens are the added tokens a tokenizer marks special (tokenizer.json), whatever
tokenizer_config.json lists; a text too long for the context window is refused before it is tokenized.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from langchain_starcoder import ContextFile, StarCoderEngine, StarCoderPromptTemplate, build_fim_prompt
from langchain_starcoder._chat import chat_prompt_ids
from langchain_starcoder._tokens import control_tokens, max_text_chars
from langchain_starcoder.errors import ContextLengthError
from langchain_starcoder.fim import fim_stop_token_ids
from langchain_starcoder.testing import SPECIAL_TOKENS, copy_checkpoint

#: A template whose own text writes control tokens other than <|endoftext|>.
FILE_SEP_CHAT = "{% for m in messages %}<file_sep>{{ m['role'] }}\n{{ m['content'] }}{% endfor %}<file_sep>"


@pytest.fixture(scope="module")
def unlisted_path(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint with no additional_special_tokens in tokenizer_config.json: tokenizer.json
    still marks <file_sep> and the FIM tokens special (valid: transformers and tokenizers accept it)."""
    path = copy_checkpoint(tiny_path, tmp_path_factory.mktemp("unlisted"))
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    del config["additional_special_tokens"]
    config_file.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def unlisted(unlisted_path: Path) -> StarCoderEngine:
    engine = StarCoderEngine.load(unlisted_path)
    yield engine
    engine.close()


def test_transformers_loads_the_unlisted_tokenizer(unlisted_path: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(unlisted_path)
    assert hf.all_special_tokens == ["<|endoftext|>"]  # what the config names...
    assert hf.encode("<file_sep>") == [hf.convert_tokens_to_ids("<file_sep>")]  # ...yet it parses them


@pytest.mark.parametrize("which", ["listed", "unlisted"])
def test_control_tokens_are_the_special_added_tokens(
    which: str, tiny_engine: StarCoderEngine, unlisted: StarCoderEngine
) -> None:
    engine = tiny_engine if which == "listed" else unlisted
    assert control_tokens(engine.tokenizer) == set(SPECIAL_TOKENS)
    assert control_tokens(engine.tokenizer._tokenizer.backend_tokenizer) == set(SPECIAL_TOKENS)
    assert engine.token_id("self") is None  # an ordinary vocabulary entry is no control token
    assert engine.encode("self") != []


def test_template_text_parses_what_a_raw_prompt_parses(
    tiny_engine: StarCoderEngine, unlisted: StarCoderEngine
) -> None:
    for token in SPECIAL_TOKENS:
        template = StarCoderPromptTemplate.from_template(token + "{code}")
        for engine in (tiny_engine, unlisted):
            raw = engine.encode(token + "x = 1\n")
            assert raw[0] == engine.token_id(token) is not None, token
            assert engine.encode_segments(template.segments(code="x = 1\n")) == raw, token
            # A variable is data, whichever control string it holds.
            data = engine.encode_segments(template.segments(code=token))
            assert data == [engine.token_id(token), *engine.encode(token, special_tokens=False)]
    # Both tokenizers give the same ids: the same vocabulary, the same control tokens.
    prompt = "<file_sep>a.py\n<fim_prefix>x<fim_suffix>y<fim_middle>"
    assert unlisted.encode(prompt) == tiny_engine.encode(prompt)


def test_chat_template_text_parses_every_control_token(
    tiny_engine: StarCoderEngine, unlisted: StarCoderEngine
) -> None:
    messages = [("user", "<file_sep>a"), ("assistant", "b")]
    for engine in (tiny_engine, unlisted):
        ids = chat_prompt_ids(engine, messages, FILE_SEP_CHAT)
        assert ids.count(engine.token_id("<file_sep>")) == 3  # the template's, not the content's
    assert chat_prompt_ids(unlisted, messages, FILE_SEP_CHAT) == chat_prompt_ids(
        tiny_engine, messages, FILE_SEP_CHAT
    )


def test_fim_and_stops_on_the_unlisted_tokenizer(
    tiny_engine: StarCoderEngine, unlisted: StarCoderEngine
) -> None:
    files = [ContextFile("a.py", "x = '<file_sep>'\n")]
    expected = build_fim_prompt(tiny_engine, "def f(", "):\n", context_files=files, repo_name="r")
    assert build_fim_prompt(unlisted, "def f(", "):\n", context_files=files, repo_name="r") == expected
    assert fim_stop_token_ids(unlisted) == fim_stop_token_ids(tiny_engine)
    assert {unlisted.decode([i]) for i in fim_stop_token_ids(unlisted)} >= {"<file_sep>", "<fim_middle>"}


# --- how much text fits ------------------------------------------------------------------------

LONGEST = max(SPECIAL_TOKENS, key=len)  # the tiny vocabulary's longest entry: one token when parsed


def test_the_bound_is_tight(tiny_engine: StarCoderEngine) -> None:
    """A text of the bound's length can fit exactly; one character more is refused untokenized."""
    room = tiny_engine.context_window - 4
    assert max_text_chars(tiny_engine.tokenizer, room) == room * len(LONGEST)
    exact = LONGEST * room
    assert len(tiny_engine.encode(exact)) == room
    assert tiny_engine.generate(exact, max_tokens=4).completion_tokens >= 1
    with pytest.raises(ContextLengthError, match=rf"has {len(exact) + 1:,} characters.*Shorten the prompt"):
        tiny_engine.generate(exact + "x", max_tokens=4)


text_or_control = st.lists(st.one_of(st.text(max_size=20), st.sampled_from(SPECIAL_TOKENS)), max_size=12)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=text_or_control)
def test_no_token_stands_for_more_than_the_longest(tiny_engine: StarCoderEngine, pieces: list[str]) -> None:
    text = "".join(pieces)
    for special in (True, False):
        assert len(text) <= max_text_chars(
            tiny_engine.tokenizer, len(tiny_engine.encode(text, special_tokens=special))
        )


def test_no_bound_where_the_tokenizer_may_drop_text(tiny_path: Path) -> None:
    from tokenizers import Tokenizer, normalizers, pre_tokenizers

    for change in (
        lambda t: setattr(t, "normalizer", normalizers.Strip()),
        lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Whitespace()),
        lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Split(" ", behavior="removed")),
    ):
        tokenizer = Tokenizer.from_file(str(tiny_path / "tokenizer.json"))
        change(tokenizer)
        assert max_text_chars(tokenizer, 100) is None
    assert max_text_chars(Tokenizer.from_file(str(tiny_path / "tokenizer.json")), 100) == 100 * len(LONGEST)


def _entry_points(engine: StarCoderEngine, text: str) -> dict:
    async def astream() -> None:
        async for _ in engine.astream(text, max_tokens=4):
            pass

    return {
        "generate": lambda: engine.generate(text, max_tokens=4),
        "data": lambda: engine.generate(text, max_tokens=4, parse_special_tokens=False),
        "stream": lambda: list(engine.stream(text, max_tokens=4)),
        "agenerate": lambda: asyncio.run(engine.agenerate(text, max_tokens=4)),
        "astream": lambda: asyncio.run(astream()),
        "batch": lambda: engine.generate_batch(["def f():", text], max_tokens=4),
        "template": lambda: engine.encode_segments([("<file_sep>", False), (text, True)]),
        "chat": lambda: chat_prompt_ids(engine, [("user", text)], FILE_SEP_CHAT),
    }


@pytest.mark.parametrize("entry", list(_entry_points(None, "")))  # type: ignore[arg-type]
def test_text_too_long_is_refused_before_tokenizing(tiny_engine: StarCoderEngine, entry: str) -> None:
    """Every text entry point refuses, by its length, a prompt the context window cannot hold."""
    text = "x" * (max_text_chars(tiny_engine.tokenizer, tiny_engine.context_window) + 1)
    with pytest.raises(
        ContextLengthError, match=r"has [\d,]+ characters.*context window.*Shorten the prompt"
    ):
        _entry_points(tiny_engine, text)[entry]()
    assert tiny_engine.generate("def f():", max_tokens=2).completion_tokens == 2  # still usable


def test_counting_is_never_refused(tiny_engine: StarCoderEngine, chat_path: Path) -> None:
    """Counting is how callers find out a text is too long (LangChain's trim_messages, token
    budgets): the counts of a template prompt and of a chat too long to generate from still answer."""
    from langchain_core.messages import HumanMessage

    from langchain_starcoder import ChatStarCoder, StarCoderLLM

    text = "x" * (max_text_chars(tiny_engine.tokenizer, tiny_engine.context_window) + 1)
    llm = StarCoderLLM(model=str(tiny_engine.path))
    prompt = StarCoderPromptTemplate.from_template("<file_sep>{code}").format(code=text)
    assert len(llm.get_token_ids(prompt)) > tiny_engine.context_window
    with pytest.raises(ContextLengthError):
        llm.invoke(prompt, max_tokens=2)
    chat = ChatStarCoder(model=str(chat_path))
    assert chat.get_num_tokens_from_messages([HumanMessage(text)]) > tiny_engine.context_window


def test_huge_prompt_is_refused_in_milliseconds(tiny_engine: StarCoderEngine) -> None:
    """A 16 MB prompt took tens of seconds and GBs to tokenize before the window was checked."""
    text = "def add(a, b):\n    return a + b\n" * 500_000
    start = time.perf_counter()
    with pytest.raises(ContextLengthError, match=f"has {len(text):,} characters"):
        tiny_engine.generate(text, max_tokens=16)
    assert time.perf_counter() - start < 1.0


def test_a_long_tokenization_gives_its_memory_back(tiny_path: Path) -> None:
    """glibc keeps what the tokenizer's threads freed (~200 MiB after 2 MB of text) unless trimmed."""
    script = f"""
import psutil
from langchain_starcoder import StarCoderEngine
engine = StarCoderEngine.load({str(tiny_path)!r})
engine.count_tokens("x = 1\\n" * 10)
before = psutil.Process().memory_info().rss
assert engine.count_tokens("def add(a, b):\\n    return a + b\\n" * 60_000) > 500_000
print((psutil.Process().memory_info().rss - before) >> 20)
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    )
    assert int(out.stdout.split()[-1]) < 64, out.stdout  # MiB still held after the count


def test_template_and_chat_controls_counted(unlisted: StarCoderEngine) -> None:
    """On the unlisted tokenizer a template's own control tokens are control ids, its data is not."""
    template = StarCoderPromptTemplate.from_template("<file_sep>{path}\n{code}<file_sep>notes.md\n")
    ids = unlisted.encode_segments(template.segments(path="<file_sep>", code="<|endoftext|><fim_middle>"))
    controls = {unlisted.token_id(t) for t in SPECIAL_TOKENS}
    assert Counter(i for i in ids if i in controls) == Counter({unlisted.token_id("<file_sep>"): 2})
