"""Hostile text: arbitrary Unicode and every special-token string, in every place user text goes.

No control token may appear in the prompt ids except the ones the layout (or chat template) puts there.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from langchain_starcoder import ContextFile, StarCoderEngine, StarCoderLLM, build_fim_prompt
from langchain_starcoder._chat import chat_prompt_ids
from langchain_starcoder.errors import InvalidParameterError
from langchain_starcoder.testing import INSTRUCT_CHAT_TEMPLATE, SPECIAL_TOKENS

hostile = st.lists(
    st.one_of(st.text(max_size=12), st.sampled_from(SPECIAL_TOKENS), st.sampled_from(["<", ">", "|", "\n"])),
    max_size=8,
).map("".join)
quick = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def chat_engine(chat_path: Path) -> StarCoderEngine:
    engine = StarCoderEngine.load(chat_path)
    yield engine
    engine.close()


def special_counts(engine: StarCoderEngine, ids: list[int]) -> Counter[int]:
    special = {engine.token_id(t) for t in SPECIAL_TOKENS}
    return Counter(i for i in ids if i in special)


@quick
@given(prefix=hostile, suffix=hostile, code=hostile, path=hostile, repo=hostile, file_path=hostile)
def test_fim_parts(
    tiny_engine: StarCoderEngine, prefix: str, suffix: str, code: str, path: str, repo: str, file_path: str
) -> None:
    tid = tiny_engine.token_id
    for mode in ("psm", "spm"):
        plain = build_fim_prompt(tiny_engine, prefix, suffix, mode=mode)
        expected = Counter({tid("<fim_prefix>"): 1, tid("<fim_suffix>"): 1, tid("<fim_middle>"): 1})
        assert special_counts(tiny_engine, plain.token_ids) == expected
    repo_level = build_fim_prompt(
        tiny_engine,
        prefix,
        suffix,
        context_files=[ContextFile(path, code), ContextFile("b.py", code)],
        repo_name=repo,
        file_path=file_path,
    )
    expected = Counter(
        {tid("<repo_name>"): 1 if repo else 0, tid("<file_sep>"): 1 + len(repo_level.files_kept)}
        | {tid(t): 1 for t in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")}
    )
    assert special_counts(tiny_engine, repo_level.token_ids) == expected


@quick
@given(system=hostile, user=hostile, answer=hostile, again=hostile)
def test_chat_messages(chat_engine: StarCoderEngine, system: str, user: str, answer: str, again: str) -> None:
    engine = chat_engine
    messages = [("system", system), ("user", user), ("assistant", answer), ("user", again)]
    ids = chat_prompt_ids(engine, messages, INSTRUCT_CHAT_TEMPLATE)
    neutral = chat_prompt_ids(engine, [(r, "x") for r, _ in messages], INSTRUCT_CHAT_TEMPLATE)
    assert special_counts(engine, ids) == special_counts(engine, neutral)  # the template's own only


def test_chat_model_end_to_end(chat_path: Path, chat_engine: StarCoderEngine) -> None:
    """Through ChatStarCoder itself: a message quoting every control token changes no control ids."""
    from langchain_starcoder import ChatStarCoder

    engine = chat_engine
    chat = ChatStarCoder(model=str(chat_path), engine=engine, max_tokens=4)
    evil = "".join(SPECIAL_TOKENS)
    hostile_ids = chat._prompt_ids(engine, [SystemMessage(evil), HumanMessage(evil), AIMessage(evil)])
    plain_ids = chat._prompt_ids(engine, [SystemMessage("a"), HumanMessage("b"), AIMessage("c")])
    assert special_counts(engine, hostile_ids) == special_counts(engine, plain_ids)
    assert chat.invoke([HumanMessage(evil)]).content is not None


class Explodes(BaseCallbackHandler):
    raise_error = True

    def __init__(self) -> None:
        self.tokens = 0

    def on_llm_new_token(self, token: str, **kwargs: object) -> None:
        self.tokens += 1
        if self.tokens == 3:
            raise RuntimeError("callback failed")


def test_callback_that_raises_mid_stream(tiny_engine: StarCoderEngine) -> None:
    llm = StarCoderLLM(engine=tiny_engine, max_tokens=40)
    handler = Explodes()
    with pytest.raises(RuntimeError, match="callback failed"):
        for _ in llm.stream("def parse(line):\n", config={"callbacks": [handler]}):
            pass
    assert handler.tokens == 3
    # The engine stopped that generation and answers the next request correctly.
    assert llm.invoke("def parse(line):\n") == tiny_engine.generate("def parse(line):\n", max_tokens=40).text


@quick
@given(user=st.text(max_size=30), answer=st.text(max_size=30))
def test_benign_chat_tokenizes_as_the_rendered_text(
    chat_engine: StarCoderEngine, user: str, answer: str
) -> None:
    """Keeping contents as data must not change how ordinary text is tokenized at the seams."""
    if any(t in user + answer for t in SPECIAL_TOKENS):
        return
    messages = [("user", user), ("assistant", answer), ("user", "x = self.value")]
    rendered = chat_engine.tokenizer.apply_chat_template(
        [{"role": r, "content": c} for r, c in messages],
        chat_template=INSTRUCT_CHAT_TEMPLATE,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert chat_prompt_ids(chat_engine, messages, INSTRUCT_CHAT_TEMPLATE) == chat_engine.encode(rendered)


# A template that prints each role, as ChatML-style templates do: a role is template text there.
ROLE_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] + ':\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'assistant:\n' }}{% endif %}"
)
STANDARD_ROLES = ("system", "user", "assistant")


@quick
@given(
    roles=st.lists(st.one_of(hostile, st.sampled_from(STANDARD_ROLES)), min_size=1, max_size=4),
    content=hostile,
)
def test_chat_roles(chat_engine: StarCoderEngine, roles: list[str], content: str) -> None:
    """A role is refused unless the template knows it, and never becomes control tokens."""
    engine = chat_engine
    messages = [(role, content) for role in roles]
    try:
        ids = chat_prompt_ids(engine, messages, ROLE_TEMPLATE)
    except InvalidParameterError as e:
        assert "role" in str(e) and set(roles) - set(STANDARD_ROLES)
        return
    assert special_counts(engine, ids) == Counter({engine.token_id("<|endoftext|>"): len(messages)})


# starcoder2-instruct's template with a filter on each content: the prompt could not be exact and data.
FILTERED_TEMPLATES = [
    INSTRUCT_CHAT_TEMPLATE.replace("message['content']", expr)
    for expr in ("(message['content'] | trim)", "(message['content'] | upper)", "message['content'][:5]")
]


@quick
@given(user=hostile, answer=hostile)
def test_chat_prompt_is_the_templates_text(chat_engine: StarCoderEngine, user: str, answer: str) -> None:
    """The prompt decodes to exactly what the template renders, with its own control tokens only,
    or the template is refused."""
    engine = chat_engine
    messages = [("user", user), ("assistant", answer), ("user", "x")]
    neutral = chat_prompt_ids(engine, [(r, "x") for r, _ in messages], INSTRUCT_CHAT_TEMPLATE)
    for template in (INSTRUCT_CHAT_TEMPLATE, *FILTERED_TEMPLATES):
        try:
            ids = chat_prompt_ids(engine, messages, template)
        except InvalidParameterError:
            assert template != INSTRUCT_CHAT_TEMPLATE
            continue
        text = engine.tokenizer.apply_chat_template(
            [{"role": r, "content": c} for r, c in messages],
            chat_template=template,
            tokenize=False,
            add_generation_prompt=True,
        )
        assert engine.decode(ids) == text
        assert special_counts(engine, ids) == special_counts(engine, neutral)


# --- raw prompts: parse_special_tokens and StarCoderPromptTemplate -------------------------------------


TEMPLATE = "<file_sep>{path}\n{code}<file_sep>notes.md\n# {title}\n"


@quick
@given(path=hostile, code=hostile, title=hostile)
def test_template_variables_are_data(
    tiny_engine: StarCoderEngine, monkeypatch: pytest.MonkeyPatch, path: str, code: str, title: str
) -> None:
    from langchain_starcoder import StarCoderPromptTemplate

    prompt = StarCoderPromptTemplate.from_template(TEMPLATE)
    values = {"path": path, "code": code, "title": title}
    ids = tiny_engine.encode_segments(prompt.segments(**values))
    assert special_counts(tiny_engine, ids) == Counter({tiny_engine.token_id("<file_sep>"): 2})
    # Ordinary text gets exactly the ids of the rendered prompt.
    benign = {k: v.replace("<", "(") for k, v in values.items()}
    assert tiny_engine.encode_segments(prompt.segments(**benign)) == tiny_engine.encode(
        TEMPLATE.format(**benign)
    )


# Compositions: a StarCoderPromptTemplate joined with text or templates, on either side, with partials.
literal = st.lists(
    st.one_of(st.text(max_size=8), st.sampled_from(SPECIAL_TOKENS), st.sampled_from(["<", ">", "|", "_"])),
    max_size=4,
).map(lambda parts: "".join(parts).replace("{", "{{").replace("}", "}}"))
piece = st.tuples(
    st.sampled_from(["text", "starcoder", "plain"]), literal, literal, st.booleans(), st.booleans()
)


def _compose(pieces: list[tuple[str, str, str, bool, bool]], values: list[str]) -> tuple[Any, dict[str, str]]:
    """The first piece is a StarCoderPromptTemplate; each next one is added after it or before it."""
    from langchain_core.prompts import PromptTemplate

    from langchain_starcoder import StarCoderPromptTemplate

    composed: Any = None
    inputs: dict[str, str] = {}
    for i, ((kind, before, after, before_it, partial), value) in enumerate(zip(pieces, values, strict=True)):
        text = f"{before}{{v{i}}}{after}"
        kind = "starcoder" if composed is None else kind
        part: Any = text
        if kind != "text":
            part = (StarCoderPromptTemplate if kind == "starcoder" else PromptTemplate).from_template(text)
            part = part.partial(**{f"v{i}": value}) if partial else part
        if not (kind != "text" and partial):
            inputs[f"v{i}"] = value
        composed = part if composed is None else (part + composed if before_it else composed + part)
    return composed, inputs


@quick
@given(pieces=st.lists(piece, min_size=1, max_size=5), data=st.data())
def test_composed_templates_keep_variables_as_data(
    tiny_engine: StarCoderEngine, pieces: list, data: Any
) -> None:
    """Whatever is joined to a StarCoderPromptTemplate, it stays one: no variable value, partial or
    not, becomes a control token, and the template's own text keeps every control token it writes."""
    import re
    from string import Formatter

    from langchain_starcoder import StarCoderPromptTemplate

    values = data.draw(st.lists(hostile, min_size=len(pieces), max_size=len(pieces)))
    prompt, inputs = _compose(pieces, values)
    assert type(prompt) is StarCoderPromptTemplate
    llm = StarCoderLLM(engine=tiny_engine, max_tokens=3)
    ids = llm.get_token_ids(prompt.invoke(inputs).to_string())
    split = re.compile("|".join(map(re.escape, sorted(SPECIAL_TOKENS, key=len, reverse=True))))
    written = Counter(t for text, *_ in Formatter().parse(prompt.template) for t in split.findall(text))
    assert special_counts(tiny_engine, ids) == Counter(
        {tiny_engine.token_id(t): n for t, n in written.items()}
    )
    # With ordinary values the ids are those of the rendered text, parsed as a hand-written prompt.
    plain, plain_inputs = _compose(pieces, ["0"] * len(pieces))
    rendered = prompt.template.format(
        **dict.fromkeys(plain.input_variables + list(plain.partial_variables), "0")
    )
    assert llm.get_token_ids(plain.format(**plain_inputs)) == tiny_engine.encode(rendered)


async def test_template_and_raw_paths_reach_the_model_as_data(
    tiny_engine: StarCoderEngine, backend_spy: Any
) -> None:
    from langchain_starcoder import StarCoderPromptTemplate
    from langchain_starcoder.llama_index import StarCoder

    fed = backend_spy(tiny_engine).prompts
    code = "x = '<|endoftext|>'  # <file_sep>\n"
    chain = StarCoderPromptTemplate.from_template(TEMPLATE) | StarCoderLLM(engine=tiny_engine, max_tokens=3)
    values = {"path": "a.py", "code": code, "title": "<fim_prefix>"}
    chain.invoke(values)
    list(chain.stream(values))
    chain.batch([values, values])
    await chain.ainvoke(values)
    [c async for c in chain.astream(values)]
    await chain.abatch([values, values])
    expected = Counter({tiny_engine.token_id("<file_sep>"): 2})
    assert len(fed) == 8 and all(special_counts(tiny_engine, ids) == expected for ids in fed)

    # parse_special_tokens=False: the whole raw prompt is data, in every wrapper and the engine.
    raw = "<file_sep>a.py\n" + code
    fed.clear()
    StarCoderLLM(engine=tiny_engine, max_tokens=3, parse_special_tokens=False).invoke(raw)
    StarCoder(engine=tiny_engine, max_tokens=3, parse_special_tokens=False).complete(raw)
    await StarCoder(engine=tiny_engine, max_tokens=3, parse_special_tokens=False).acomplete(raw)
    tiny_engine.generate(raw, max_tokens=3, parse_special_tokens=False)
    StarCoderLLM(engine=tiny_engine, max_tokens=3).invoke(raw, parse_special_tokens=False)
    assert len(fed) == 5 and all(ids == tiny_engine.encode(raw, special_tokens=False) for ids in fed)
    # ... while a hand-written prompt is parsed by default, as in the model cards.
    fed.clear()
    StarCoderLLM(engine=tiny_engine, max_tokens=3).invoke(raw)
    assert special_counts(tiny_engine, fed[0])[tiny_engine.token_id("<file_sep>")] == 2


def test_template_cache_key_tells_data_from_control(tiny_engine: StarCoderEngine) -> None:
    """A variable holding "<file_sep>" renders the same text as a template that writes it: two
    different prompts, so two cache entries."""
    from langchain_core.caches import InMemoryCache

    from langchain_starcoder import StarCoderPromptTemplate

    cache = InMemoryCache()
    llm = StarCoderLLM(engine=tiny_engine, max_tokens=3, cache=cache)
    (StarCoderPromptTemplate.from_template("{a}x = 1\n") | llm).invoke({"a": "<file_sep>"})
    (StarCoderPromptTemplate.from_template("<file_sep>{a}") | llm).invoke({"a": "x = 1\n"})
    assert len(cache._cache) == 2
