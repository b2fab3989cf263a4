"""Chat templates: the prompt is exactly what the template renders, or the template is refused.

Real templates, rendered by the real tokenizer classes (mlx-lm's wrapper over transformers), on the
tiny instruct checkpoint.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from langchain_core.messages import ChatMessage, HumanMessage

from langchain_starcoder import ChatStarCoder, StarCoderEngine
from langchain_starcoder._chat import chat_prompt_ids
from langchain_starcoder.errors import InvalidParameterError
from langchain_starcoder.testing import INSTRUCT_CHAT_TEMPLATE

#: A template that prints each role, as ChatML-style templates do.
ROLE_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] + ':\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'assistant:\n' }}{% endif %}"
)
#: A template that builds a control token out of the role, as Phi-3's ``'<|' + role + '|>'`` does.
ANGLE_TEMPLATE = (
    "{% for message in messages %}{{ '<' + message['role'] + '>' + message['content'] }}{% endfor %}"
)
#: A template that names roles of its own (attribute and item access, ``==`` and ``in``).
NAMED_ROLES_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'tool' %}{{ 'Output:\n' + m.content + '\n' }}"
    "{% elif m['role'] in ['ipython', 'critic'] %}{{ m['role'] + ' says:\n' + m.content + '\n' }}"
    "{% else %}{{ m.role + ':\n' + m.content + eos_token }}{% endif %}{% endfor %}"
)


def instruct_with(content: str) -> str:
    """The instruct template with each message's content written as ``content``."""
    return INSTRUCT_CHAT_TEMPLATE.replace("message['content']", content)


FILTERS = {
    "trim": "(message['content'] | trim)",
    "upper": "(message['content'] | upper)",
    "lower": "(message['content'] | lower)",
    "slice": "message['content'][:40]",
    "strip method": "message['content'].strip()",
    "replace": "(message['content'] | replace('\\t', '    '))",
}


@pytest.fixture(scope="module")
def engine(chat_path: Path) -> StarCoderEngine:
    engine = StarCoderEngine.load(chat_path)
    yield engine
    engine.close()


def rendered(engine: StarCoderEngine, template: str, messages: Sequence[tuple[str, str]]) -> str:
    """The text the tokenizer's own chat templating makes of ``messages``."""
    return engine.tokenizer.apply_chat_template(
        [{"role": r, "content": c} for r, c in messages],
        chat_template=template,
        tokenize=False,
        add_generation_prompt=True,
    )


def test_instruct_template_keeps_contents_exactly(engine: StarCoderEngine) -> None:
    """starcoder2-instruct's template inserts contents unchanged, whitespace included."""
    messages = [
        ("system", "\n  Be brief.  \n"),
        ("user", "  \n def f():\n\treturn 1\n\n  "),
        ("assistant", "\n\nx = 1\n "),
        ("user", "\t"),
    ]
    ids = chat_prompt_ids(engine, messages, INSTRUCT_CHAT_TEMPLATE)
    text = rendered(engine, INSTRUCT_CHAT_TEMPLATE, messages)
    assert ids == engine.encode(text)
    assert engine.decode(ids) == text


@pytest.mark.parametrize("content", ["def f(): pass", "  padded\n", "x" * 60])
@pytest.mark.parametrize("expr", FILTERS.values(), ids=FILTERS.keys())
def test_templates_that_filter_contents_are_refused(engine: StarCoderEngine, expr: str, content: str) -> None:
    """Refused whatever the messages, even when the filter happens to leave them as they are."""
    with pytest.raises(InvalidParameterError, match=r"alters message contents.*chat_template="):
        chat_prompt_ids(engine, [("user", content), ("assistant", "ok")], instruct_with(expr))


def test_template_that_branches_on_content_is_refused(engine: StarCoderEngine) -> None:
    """A template that skips empty messages renders another prompt than the one the ids would hold."""
    template = instruct_with("message['content']").replace(
        "{% for message in messages %}", "{% for message in messages if message['content'] %}"
    )
    messages = [("user", "Sort a list."), ("assistant", ""), ("user", "Faster?")]
    with pytest.raises(InvalidParameterError, match="alters message contents"):
        chat_prompt_ids(engine, messages, template)
    # The same template with no empty message is exact, so it is used.
    messages[1] = ("assistant", "sorted(xs)")
    ids = chat_prompt_ids(engine, messages, template)
    assert engine.decode(ids) == rendered(engine, template, messages)


@pytest.mark.parametrize("role", ["<|endoftext|>", "<file_sep>", "user<|endoftext|>", "file_sep", "tool", ""])
@pytest.mark.parametrize("template", [ROLE_TEMPLATE, ANGLE_TEMPLATE, INSTRUCT_CHAT_TEMPLATE])
def test_roles_the_template_does_not_know_are_refused(
    engine: StarCoderEngine, template: str, role: str
) -> None:
    messages = [("user", "hi"), (role, "hello")]
    with pytest.raises(InvalidParameterError, match=r"role .*'assistant', 'system', 'user'"):
        chat_prompt_ids(engine, messages, template)


def test_roles_the_template_names_are_allowed(engine: StarCoderEngine) -> None:
    messages = [("user", "run it"), ("tool", "42"), ("ipython", "x"), ("critic", "fine"), ("assistant", "ok")]
    ids = chat_prompt_ids(engine, messages, NAMED_ROLES_TEMPLATE)
    assert engine.decode(ids) == rendered(engine, NAMED_ROLES_TEMPLATE, messages)
    with pytest.raises(
        InvalidParameterError, match=r"'assistant', 'critic', 'ipython', 'system', 'tool', 'user'"
    ):
        chat_prompt_ids(engine, [("<|endoftext|>", "x")], NAMED_ROLES_TEMPLATE)


def test_known_roles_become_the_templates_control_tokens(engine: StarCoderEngine) -> None:
    """A template may build control tokens from a known role; that is the template's text, not data."""
    template = (
        "{% for m in messages if m['role'] in ('file_sep', 'user') %}"
        "{{ '<' + m['role'] + '>' + m['content'] }}{% endfor %}"
    )
    ids = chat_prompt_ids(engine, [("file_sep", "<file_sep>")], template)
    assert ids == [engine.token_id("<file_sep>"), *engine.encode("<file_sep>", special_tokens=False)]


def test_chat_model_refuses_a_hostile_role(chat_path: Path, engine: StarCoderEngine) -> None:
    chat = ChatStarCoder(model=str(chat_path), engine=engine, max_tokens=4)
    with pytest.raises(InvalidParameterError, match=re.escape("role '<|endoftext|>'")):
        chat._prompt_ids(engine, [HumanMessage("hi"), ChatMessage(role="<|endoftext|>", content="x")])
    trim = instruct_with(FILTERS["trim"])
    filtered = ChatStarCoder(model=str(chat_path), engine=engine, chat_template=trim, max_tokens=4)
    with pytest.raises(InvalidParameterError, match="alters message contents"):
        filtered.invoke([HumanMessage("  hi  ")])


# The shape of starcoder2-15b-instruct's own template: `{%-` whitespace control, a fixed preamble,
# system messages refused by the template itself, and every role but "user" rendered as a response.
SC2_INSTRUCT_SHAPED = """{{ bos_token }}{{ 'You answer coding questions.\\n\\n' }}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {{ raise_exception('System messages are not allowed in this template.') }}
    {%- elif message['role'] == 'user' %}
{{ '### Instruction\\n' + message['content'] + '\\n\\n' }}
    {%- else %}
{{ '### Response\\n' + message['content'] + eos_token + '\\n\\n' }}
    {%- endif %}
{%- endfor %}
{{ '### Response\\n' }}"""


def test_instruct_shaped_template_works_as_written(engine: StarCoderEngine) -> None:
    messages = [("user", "\n  Sort xs.\n"), ("assistant", "  sorted(xs)\n"), ("user", "<|endoftext|> ")]
    ids = chat_prompt_ids(engine, messages, SC2_INSTRUCT_SHAPED)
    text = rendered(engine, SC2_INSTRUCT_SHAPED, messages)
    assert text.startswith("<|endoftext|>You answer coding questions.\n\n### Instruction\n\n  Sort xs.\n\n\n")
    assert engine.decode(ids) == text
    eos = engine.token_id("<|endoftext|>")
    assert ids.count(eos) == 2  # bos and the one response's end; the quoted one is text
    with pytest.raises(InvalidParameterError, match="System messages are not allowed"):
        chat_prompt_ids(engine, [("system", "Be brief."), ("user", "hi")], SC2_INSTRUCT_SHAPED)


def test_template_with_a_generation_tag(engine: StarCoderEngine) -> None:
    """transformers' ``{% generation %}`` tag is not plain Jinja; the roles the template names still count."""
    template = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ m['content'] }}{% else %}"
        "{{ m['role'] + ':' }}{%- generation -%}{{ m['content'] + eos_token }}{% endgeneration %}{% endif %}"
        "{% endfor %}"
    )
    messages = [("user", "hi"), ("assistant", "hello"), ("tool", "42")]
    assert engine.decode(chat_prompt_ids(engine, messages, template)) == rendered(engine, template, messages)
    with pytest.raises(InvalidParameterError, match="does not know the role 'ipython'"):
        chat_prompt_ids(engine, [("ipython", "42")], template)


def test_llama_index_chat_refuses_roles_and_filters(engine: StarCoderEngine) -> None:
    from llama_index.core.base.llms.types import ChatMessage as LlamaMessage

    from langchain_starcoder.llama_index import StarCoder

    llm = StarCoder(engine=engine, max_tokens=4)
    other = [LlamaMessage(role="user", content="run it"), LlamaMessage(role="chatbot", content="42")]
    with pytest.raises(InvalidParameterError, match="does not know the role 'chatbot'"):
        llm.chat(other)
    # A tool's result is no such role: without a "tool" role it is a user turn (test_llama_index_tools.py).
    tool = [LlamaMessage(role="user", content="run it"), LlamaMessage(role="tool", content="42")]
    assert llm.chat(tool).message.content is not None
    named = StarCoder(engine=engine, max_tokens=4, chat_template=NAMED_ROLES_TEMPLATE)
    assert named.chat(tool).message.content is not None
    trim = StarCoder(engine=engine, max_tokens=4, chat_template=instruct_with(FILTERS["trim"]))
    with pytest.raises(InvalidParameterError, match="alters message contents"):
        trim.chat([LlamaMessage(role="user", content="hi")])
