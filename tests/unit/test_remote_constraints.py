"""A constraint in each server's fields (backends/remote/constraints.py): llama.cpp's json_schema and GBNF
(a regex converted here, checked to mean the same), vLLM's structured_outputs. The real servers honour
them in tests/integration/test_remote.py."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from langchain_starcoder import StarCoderEngine
from langchain_starcoder._tools import COMPACT
from langchain_starcoder.backends.grammar import GrammarCompiler
from langchain_starcoder.backends.remote.constraints import (
    json_schema_lark,
    llama_cpp_fields,
    regex_to_gbnf,
    vllm_fields,
)
from langchain_starcoder.backends.remote.llama_cpp import LlamaCpp
from langchain_starcoder.backends.remote.vllm import VLLM
from langchain_starcoder.errors import GrammarError
from langchain_starcoder.types import GenerationParams

REGEXES = [
    r"(yes|no) [0-9][0-9]?",
    r"[a-z_][a-z0-9_]{0,8}",
    r'"[^"\\\n]{0,6}"',
    r"\d{2,3}(\.\d)?",
    r"(ab|c)+x*",
    r"[\]\-^a]{1,3}",
    r"a.b",
    r"\w+\s\w+",
]


@pytest.fixture(scope="module")
def compiler(tiny_engine: StarCoderEngine) -> GrammarCompiler:
    return GrammarCompiler(tiny_engine.tokenizer, tiny_engine.vocab_size, tiny_engine.eos_token_ids)


@pytest.mark.parametrize("regex", REGEXES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_gbnf_of_a_regex_takes_what_the_regex_takes(compiler, regex: str, data: st.DataObject) -> None:
    """Strings the regex matches (ASCII: GBNF's classes are) are sentences of its GBNF, and a string
    it does not match is not."""
    gbnf = compiler.compile(("grammar", regex_to_gbnf(regex)))
    text = data.draw(st.from_regex(re.compile(regex, re.ASCII), fullmatch=True).filter(str.isascii))
    assert gbnf.accepts(text), (regex, text)
    other = data.draw(st.text(alphabet="abxyz019 _.-", max_size=6))
    assert gbnf.accepts(other) == bool(re.fullmatch(regex, other, re.ASCII)), (regex, other)


@pytest.mark.parametrize(
    ("regex", "says"),
    [
        ("(?=a)b", "assert"),
        (r"(a)\1", "groupref"),
        ("(?i)abc", "flags"),
        (r"[\Da]", r"\\D"),
        ("(", "invalid"),
    ],
)
def test_what_gbnf_cannot_express_is_refused_clearly(regex: str, says: str) -> None:
    with pytest.raises(GrammarError, match=says):
        regex_to_gbnf(regex)


def test_each_server_gets_the_constraint_in_its_fields() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    gbnf = 'root ::= "a" | "b"'
    lark = 'start: "a" | "b"'
    assert llama_cpp_fields(GenerationParams.create()) == vllm_fields(GenerationParams.create()) == {}
    assert llama_cpp_fields(GenerationParams.create(json_schema=schema)) == {"json_schema": schema}
    assert llama_cpp_fields(GenerationParams.create(grammar=gbnf)) == {"grammar": gbnf}
    assert llama_cpp_fields(GenerationParams.create(regex="a|bc")) == {
        "grammar": 'root ::= ("a" | "b" "c")\n'
    }
    with pytest.raises(GrammarError, match="GBNF"):
        llama_cpp_fields(GenerationParams.create(grammar=lark))
    assert vllm_fields(GenerationParams.create(json_schema=schema)) == {
        "structured_outputs": {"grammar": json_schema_lark(schema)}
    }
    assert vllm_fields(GenerationParams.create(regex="a|b")) == {"structured_outputs": {"regex": "a|b"}}
    assert vllm_fields(GenerationParams.create(grammar=lark)) == {"structured_outputs": {"grammar": lark}}
    # The protocols' request bodies carry them.
    transport = SimpleNamespace(base_url="http://127.0.0.1:1")
    params = GenerationParams.create(json_schema=schema, max_tokens=4)
    assert LlamaCpp(transport, 100, {}).body([1, 2], params)["json_schema"] == schema  # type: ignore[arg-type]
    body = VLLM(transport, 100, "tiny").body([1, 2], params)  # type: ignore[arg-type]
    assert body["structured_outputs"] == {"grammar": json_schema_lark(schema)} and body["max_tokens"] == 4


def test_vllm_gets_a_schema_as_compact_json_in_llguidance_lark(compiler: GrammarCompiler) -> None:
    """vLLM 0.32 ignores a request's whitespace settings, so the schema goes as a Lark grammar in
    llguidance's dialect (which its xgrammar refuses, so its llguidance decodes it): compact JSON, as our
    own json_schema decoding writes it; a schema's own x-guidance options are kept."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "boolean"}}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    lark = json_schema_lark(schema)
    assert lark.startswith("%llguidance {}\n")
    remote = compiler.compile(("grammar", lark))
    local = compiler.compile(GenerationParams.create(json_schema=schema).constraint)  # type: ignore[arg-type]
    compact, spaced = '{"a":1,"b":[true,false]}', '{"a": 1, "b": [true, false]}'
    assert remote.accepts(compact) and local.accepts(compact) and not local.accepts(spaced)
    assert not remote.accepts(spaced) and not remote.accepts('{"a":1}')
    assert not remote.accepts('{"a":"1","b":[]}')
    assert not remote.allows("{ ") and not remote.allows('{"a":1,\n')
    # The schema's own options (our tool calls' COMPACT; separators with a space) go as they are.
    assert json.loads(lark.split("%json ", 1)[1])["x-guidance"] == {"whitespace_flexible": False}
    own = {
        **schema,
        "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
    }
    assert compiler.compile(("grammar", json_schema_lark(own))).accepts(spaced)
    assert json_schema_lark({**schema, **COMPACT}).count("x-guidance") == 1
