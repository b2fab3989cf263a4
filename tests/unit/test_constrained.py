"""Constrained decoding (json_schema, regex, grammar): outputs that finish with "stop" match in full,
"length" ones do not, on every path (plain, sampled, streamed, batched, prompt lookup, a draft model,
the prompt cache, FIM); bad or pathological constraints fail before decoding, and the engine goes on."""

from __future__ import annotations

import ast
import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from langchain_starcoder import FIMRequest, GrammarError, InvalidParameterError, StarCoderEngine
from langchain_starcoder.backends import grammar as grammar_module
from langchain_starcoder.backends.grammar import MAX_CACHED_GRAMMARS, GrammarCompiler
from langchain_starcoder.backends.masking import DraftGuide
from langchain_starcoder.checkpoints import quantize_checkpoint
from langchain_starcoder.decoding.grammar import GrammarCheck
from langchain_starcoder.decoding.sink import ChunkSink
from langchain_starcoder.types import GenerationParams

# llguidance's JSON options inside a schema: no whitespace between tokens (a random-weight model
# pads flexible whitespace until max_tokens runs out; a trained one does not).
COMPACT = {"whitespace_flexible": False}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "admin": {"type": "boolean"},
    },
    "required": ["name", "age", "admin"],
    "additionalProperties": False,
    "x-guidance": COMPACT,
}
# One Python expression: names (not keywords), numbers, strings, calls, subscripts, attributes, operators.
EXPRESSION = r"""
start: expr
expr: term ((" + " | " - " | "+" | "-") term)*
term: factor ((" * " | " // " | " % " | "*") factor)*
factor: "-" factor | primary
primary: (NAME | "(" expr ")") trailer* | NUMBER | STRING | "[" args? "]"
trailer: "(" args? ")" | "[" expr "]" | "." NAME
args: expr (", " expr){0,3}
KEYWORD: "False" | "None" | "True" | "and" | "as" | "assert" | "async" | "await" | "break" | "class"
       | "continue" | "def" | "del" | "elif" | "else" | "except" | "finally" | "for" | "from" | "global"
       | "if" | "import" | "in" | "is" | "lambda" | "nonlocal" | "not" | "or" | "pass" | "raise"
       | "return" | "try" | "while" | "with" | "yield"
NAME: /[a-zA-Z_][a-zA-Z0-9_]{0,7}/ & ~KEYWORD
NUMBER: /0|[1-9][0-9]{0,4}/
STRING: /"[a-z ]{0,8}"/
"""
IDENT_REGEX = r"[a-z]{2,8}_[0-9]{1,3}"


def allowed(compiler: GrammarCompiler, text: str, **constraint: Any) -> bool:
    """Whether ``text`` is a valid output or the start of one (all that a mask lets through)."""
    return compiler.compile(GenerationParams.create(**constraint).constraint).allows(text)


def validates(text: str, schema: dict[str, Any]) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return Draft202012Validator(schema).is_valid(value)


@pytest.fixture(scope="module")
def engine(tiny_path: Path) -> StarCoderEngine:
    engine = StarCoderEngine.load(tiny_path)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def compiler(engine: StarCoderEngine) -> GrammarCompiler:
    """A compiler of its own for the tests' checks (the engine's cache is left to the engine)."""
    return GrammarCompiler(engine.tokenizer, engine.vocab_size, engine.eos_token_ids)


# --- random JSON Schemas ---------------------------------------------------------------------------


def _leaf() -> st.SearchStrategy[dict[str, Any]]:
    bounds = st.tuples(st.integers(-50, 50), st.integers(0, 100)).map(lambda t: (t[0], t[0] + t[1]))
    return st.one_of(
        st.one_of(st.none(), st.integers(0, 8)).map(
            lambda n: {"type": "string"} if n is None else {"type": "string", "maxLength": n}
        ),
        st.one_of(st.none(), bounds).map(
            lambda b: (
                {"type": "integer"} if b is None else {"type": "integer", "minimum": b[0], "maximum": b[1]}
            )
        ),
        st.just({"type": "number"}),
        st.just({"type": "boolean"}),
        st.lists(
            st.one_of(st.text("abxyz_", min_size=1, max_size=5), st.integers(-9, 9)),
            min_size=1,
            max_size=4,
            unique=True,
        ).map(lambda values: {"enum": values}),
    )


def _object(values: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    def build(props: dict[str, Any], required: list[bool], closed: bool) -> dict[str, Any]:
        names = list(props)
        schema: dict[str, Any] = {"type": "object", "properties": props}
        schema["required"] = [n for n, r in zip(names, required, strict=False) if r]
        if closed:
            schema["additionalProperties"] = False
        return schema

    keys = st.from_regex(r"[a-z]{1,6}", fullmatch=True)
    return st.builds(
        build,
        st.dictionaries(keys, values, min_size=1, max_size=4),
        st.lists(st.booleans(), min_size=4, max_size=4),
        st.booleans(),
    )


def _array(items: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(lambda i, n: {"type": "array", "items": i, "maxItems": n}, items, st.integers(0, 3))


def _schemas() -> st.SearchStrategy[dict[str, Any]]:
    nested = st.recursive(_leaf(), lambda inner: st.one_of(_array(inner), _object(inner)), max_leaves=6)
    top = _object(nested)
    return st.builds(lambda s, compact: {**s, "x-guidance": COMPACT} if compact else s, top, st.booleans())


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schema=_schemas(), seed=st.integers(0, 2**32 - 1))
def test_random_schemas_sampled_stop_only_when_valid(
    engine: StarCoderEngine, compiler: GrammarCompiler, schema: dict[str, Any], seed: int
) -> None:
    done = engine.generate(
        'data = {"id": 1}\nnext = ', max_tokens=40, json_schema=schema, temperature=1.0, seed=seed
    )
    assert done.constrained
    assert done.finish_reason in {"stop", "length"}
    event(f"finish_reason={done.finish_reason}")  # (the share of each: --hypothesis-show-statistics)
    # "stop": the output validates against its schema; "length": it does not (an incomplete prefix).
    assert validates(done.text, schema) == (done.finish_reason == "stop"), (done.text, done.finish_reason)
    assert allowed(compiler, done.text, json_schema=schema), done.text  # never outside the schema


def test_schemas_finish_with_valid_json(engine: StarCoderEngine) -> None:
    """Not every sampled output above runs out of tokens: most small schemas finish, and validate."""
    outs = [
        engine.generate("x = ", max_tokens=40, json_schema=PERSON, temperature=1.0, seed=s) for s in range(8)
    ]
    stopped = [o for o in outs if o.finish_reason == "stop"]
    assert len(stopped) >= 4, [(o.text, o.finish_reason) for o in outs]
    for out in stopped:
        assert validates(out.text, PERSON) and out.stop_sequence is None


def test_length_under_a_constraint_is_an_incomplete_prefix(engine: StarCoderEngine) -> None:
    done = engine.generate("x = ", max_tokens=3, json_schema=PERSON)
    assert (done.finish_reason, done.constrained, done.completion_tokens) == ("length", True, 3)
    assert done.text.startswith('{"') and not validates(done.text, PERSON)


def test_schema_as_json_text_and_property_order(engine: StarCoderEngine) -> None:
    as_dict = engine.generate("x = ", max_tokens=40, json_schema=PERSON)
    as_text = engine.generate("x = ", max_tokens=40, json_schema=json.dumps(PERSON))
    assert as_text.text == as_dict.text and as_dict.finish_reason == "stop"
    assert list(json.loads(as_dict.text)) == ["name", "age", "admin"]  # the schema's order


def test_unconstrained_completions_say_so(engine: StarCoderEngine) -> None:
    done = engine.generate("x = ", max_tokens=4)
    assert done.constrained is False
    chunks = list(engine.stream("x = ", max_tokens=4))
    assert chunks[-1].constrained is False and all(c.constrained is None for c in chunks[:-1])


# --- regex and grammars ----------------------------------------------------------------------------


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_regex_sampled(engine: StarCoderEngine, seed: int) -> None:
    done = engine.generate("name = ", max_tokens=12, regex=IDENT_REGEX, temperature=1.0, seed=seed)
    assert done.constrained
    assert (re.fullmatch(IDENT_REGEX, done.text) is not None) == (done.finish_reason == "stop"), done.text
    if done.finish_reason == "length":
        assert done.completion_tokens == 12
    assert re.match(r"[a-z]{0,8}(_[0-9]{0,3})?$", done.text), done.text  # never outside the regex


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    hole=st.sampled_from(
        [("total = ", "\nprint(total)\n"), ("def f(x):\n    return ", "\n\nf(2)\n"), ("items = [", "]\n")]
    ),
)
def test_fim_middle_is_one_python_expression(
    engine: StarCoderEngine, compiler: GrammarCompiler, seed: int, hole: tuple[str, str]
) -> None:
    prefix, suffix = hole
    done = engine.infill(prefix, suffix, max_tokens=24, grammar=EXPRESSION, temperature=1.0, seed=seed)
    assert done.constrained
    if done.finish_reason == "stop":
        ast.parse(done.text, mode="eval")  # every finished middle is one expression
    else:
        assert done.finish_reason == "length" and done.completion_tokens == 24
        assert allowed(compiler, done.text, grammar=EXPRESSION), done.text  # the start of one


def test_fim_forms_and_no_suffix_trim(engine: StarCoderEngine) -> None:
    """infill, async infill and infill_batch constrain the middle alike; no overlap trim cuts it."""
    request = FIMRequest("x = ", "\nprint(x)\n")
    one = engine.infill(request, max_tokens=16, regex=IDENT_REGEX)
    other = asyncio.run(engine.ainfill(request, max_tokens=16, regex=IDENT_REGEX))
    batch = engine.infill_batch([request, request], max_tokens=16, regex=IDENT_REGEX)
    assert one.finish_reason == "stop" and re.fullmatch(IDENT_REGEX, one.text)
    assert other.text == one.text and [b.text for b in batch] == [one.text, one.text]
    # A suffix that starts with the middle's end: no trim (it would take the digit off the match).
    overlapping = []
    for digit in "0123456789":
        middle = engine.infill("x = ", f"{digit}\n", max_tokens=16, regex=IDENT_REGEX)
        untrimmed = engine.infill(
            "x = ", f"{digit}\n", max_tokens=16, regex=IDENT_REGEX, trim_suffix_overlap=False
        )
        assert middle.text == untrimmed.text and middle.finish_reason == "stop"
        overlapping += [middle.text] if middle.text.endswith(digit) else []
    assert overlapping


def test_gbnf_grammar(engine: StarCoderEngine) -> None:
    gbnf = 'root ::= answer "."\nanswer ::= "yes" | "no" | "maybe"\n'
    outs = [engine.generate("ok? ", max_tokens=8, grammar=gbnf, temperature=1.0, seed=s) for s in range(6)]
    assert {o.finish_reason for o in outs} == {"stop"}
    assert {o.text for o in outs} <= {"yes.", "no.", "maybe."}


# --- composition -----------------------------------------------------------------------------------


def test_stream_equals_generate(engine: StarCoderEngine) -> None:
    whole = engine.generate("x = ", max_tokens=40, json_schema=PERSON)
    chunks = list(engine.stream("x = ", max_tokens=40, json_schema=PERSON))
    assert "".join(c.text for c in chunks) == whole.text
    assert [t for c in chunks for t in c.token_ids] == whole.token_ids
    assert (chunks[-1].finish_reason, chunks[-1].constrained) == (whole.finish_reason, True)
    assert all(c.constrained is None for c in chunks[:-1])


async def test_async_stream_equals_generate(engine: StarCoderEngine) -> None:
    whole = engine.generate("x = ", max_tokens=40, json_schema=PERSON)
    chunks = [c async for c in engine.astream("x = ", max_tokens=40, json_schema=PERSON)]
    assert "".join(c.text for c in chunks) == whole.text
    assert (await engine.agenerate("x = ", max_tokens=40, json_schema=PERSON)).text == whole.text


def test_stop_strings(engine: StarCoderEngine) -> None:
    # A stop string after a full match: "stop"; one that cuts the match short: "length", named.
    listed = r"[a-z]{2,5}(,[a-z]{2,5}){2,4}"
    whole = engine.generate("tags = ", max_tokens=30, regex=listed)
    assert whole.finish_reason == "stop" and "," in whole.text
    first = whole.text.split(",")[0]
    done = engine.generate("tags = ", max_tokens=30, regex=r"[a-z]{2,5}(,[a-z]{2,5})*", stop=[","])
    assert (done.text, done.finish_reason, done.stop_sequence) == (first, "stop", ",")
    cut = engine.generate("tags = ", max_tokens=30, regex=listed, stop=[","])
    assert (cut.text, cut.finish_reason, cut.stop_sequence) == (first, "length", ",")


def test_prompt_lookup_gives_identical_output(engine: StarCoderEngine) -> None:
    prompt = '{"name": "ab", "age": 7, "admin": true}\n' * 3
    schema = {
        **PERSON,
        "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
    }
    plain = engine.generate(prompt, max_tokens=40, json_schema=schema, prompt_lookup_num_tokens=0)
    fast = engine.generate(prompt, max_tokens=40, json_schema=schema, prompt_lookup_num_tokens=6)
    assert fast.token_ids == plain.token_ids and fast.finish_reason == plain.finish_reason == "stop"
    assert fast.draft_tokens > 0 and plain.draft_tokens == 0
    assert validates(fast.text, schema)


def test_draft_is_cut_at_its_first_rejected_token(engine: StarCoderEngine, compiler: GrammarCompiler) -> None:
    # (no forced text here: llguidance's mask allows forced text only as its own tokenization)
    compiled = compiler.compile(("regex", "[a-c]{3}[0-9]"))
    guide = DraftGuide(compiled.matcher(), engine.vocab_size)
    a, b, c, x, nine = (engine.encode(s, special_tokens=False)[0] for s in ("a", "b", "c", "x", "9"))
    assert guide.clip([a, b, x, c]) == [a, b]
    masks = guide.masks([a, b]).result().tolist()  # after "", "a", "ab"
    assert [(row[a], row[x], row[nine]) for row in masks] == [(True, False, False)] * 3
    assert guide.clip([a, b, c, nine]) == [a, b, c, nine]  # the masks left the matcher where it was
    guide.accept([a, b, c])
    assert guide.clip([a]) == [] and guide.clip([nine]) == [nine]
    assert [(row[a], row[nine]) for row in guide.masks([]).result().tolist()] == [(False, True)]


def test_draft_model_gives_identical_output(tiny_path: Path, tmp_path: Path) -> None:
    draft = quantize_checkpoint(tiny_path, tmp_path / "q8", bits=8, progress=False)
    engine = StarCoderEngine.load(tiny_path, draft_model=draft, num_draft_tokens=3, max_prompt_caches=0)
    try:
        fast = engine.generate("x = ", max_tokens=40, json_schema=PERSON)
        plain = engine.generate("x = ", max_tokens=40, json_schema=PERSON, prompt_lookup_num_tokens=0)
    finally:
        engine.close()
    assert fast.draft_tokens > 0 and fast.token_ids == plain.token_ids and fast.finish_reason == "stop"


def test_batch_rows_each_their_own_matcher(engine: StarCoderEngine, tiny_path: Path) -> None:
    prompts = ["x = ", "def f():\n    return ", "# data\n"]
    batch = engine.generate_batch(prompts, max_tokens=40, json_schema=PERSON)
    alone = StarCoderEngine.load(tiny_path, max_prompt_caches=0)
    try:
        each = [alone.generate(p, max_tokens=40, json_schema=PERSON) for p in prompts]
    finally:
        alone.close()
    assert [b.token_ids for b in batch] == [e.token_ids for e in each]
    assert [b.finish_reason for b in batch] == ["stop"] * 3 and all(validates(b.text, PERSON) for b in batch)
    sampled = engine.generate_batch(prompts, max_tokens=40, json_schema=PERSON, temperature=1.0, seed=3)
    assert all(validates(s.text, PERSON) == (s.finish_reason == "stop") for s in sampled)


def test_prompt_cache_and_penalties_compose(engine: StarCoderEngine) -> None:
    prompt = "# a person record\nrecord = "
    first = engine.generate(prompt, max_tokens=40, json_schema=PERSON)
    again = engine.generate(prompt, max_tokens=40, json_schema=PERSON)
    assert again.cached_tokens > 0 and again.text == first.text
    penalised = engine.generate(
        prompt, max_tokens=40, json_schema=PERSON, repetition_penalty=1.3, temperature=0.8, seed=1
    )
    assert validates(penalised.text, PERSON) == (penalised.finish_reason == "stop")


# --- the sink's verdict, whatever the backend --------------------------------------------------------


def test_an_invalid_ending_is_never_reported_as_stop(
    engine: StarCoderEngine, compiler: GrammarCompiler
) -> None:
    """A backend that ended a constrained output early (a server that ignored the constraint) gets
    "length", not "stop": the front checks the finished text itself."""
    compiled = compiler.compile(GenerationParams.create(json_schema=PERSON).constraint)
    params = GenerationParams.create(json_schema=PERSON, stop_token_ids=sorted(engine.eos_token_ids))
    eos = min(engine.eos_token_ids)

    def finish(text: str) -> Any:
        chunks: list[Any] = []
        sink = ChunkSink(engine.tokenizer, params, 3, chunks.append, [GrammarCheck(compiled)])
        sink.start(0)
        for token in [*engine.encode(text, special_tokens=False), eos]:
            if sink.token(token):
                break
        sink.finish()
        return chunks[-1]

    assert finish('{"name": "ab", "age": 3').finish_reason == "length"
    assert finish('{"name": "ab", "age": 3, "admin": false, "x": 1}').finish_reason == "length"
    good = finish('{"name":"ab","age":3,"admin":false}')
    assert (good.finish_reason, good.constrained) == ("stop", True)


def test_the_constraint_reaches_the_backend(engine: StarCoderEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    submit = engine.backend.submit
    monkeypatch.setattr(engine.backend, "submit", lambda gens: seen.extend(gens) or submit(gens))
    engine.generate("x = ", max_tokens=8, json_schema=json.dumps(PERSON))
    engine.generate("x = ", max_tokens=8, grammar=EXPRESSION)
    assert seen[0].params.json_schema == PERSON and seen[0].params.regex is None
    assert seen[1].params.grammar == EXPRESSION and seen[0].grammar is not None


# --- bad and pathological constraints ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"grammar": "start: foo"}, "unknown name"),
        ({"grammar": "root ::= ("}, "GBNF"),
        ({"regex": "(abc"}, "unclosed group"),
        ({"json_schema": {"type": "objekt"}}, "objekt"),
        ({"json_schema": "{not json"}, "JSON text"),
        ({"json_schema": [1]}, "dict or JSON text"),
        ({"json_schema": PERSON, "regex": "a"}, "at most one"),
        ({"regex": ""}, "non-empty"),
    ],
)
def test_invalid_constraints_fail_before_decoding(
    engine: StarCoderEngine, monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any], message: str
) -> None:
    submitted = []
    monkeypatch.setattr(engine.backend, "submit", lambda gens: submitted.append(gens))
    with pytest.raises(GrammarError, match=re.escape(message)) as error:
        engine.generate("x = ", max_tokens=8, **settings)
    assert isinstance(error.value, InvalidParameterError)
    with pytest.raises(GrammarError):
        asyncio.run(engine.agenerate("x = ", max_tokens=8, **settings))
    with pytest.raises(GrammarError):
        engine.generate_batch(["x = ", "y = "], max_tokens=8, **settings)
    with pytest.raises(GrammarError):
        engine.infill("x = ", "\n", max_tokens=8, **settings)
    assert submitted == []  # nothing reached the backend


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def test_pathological_constraints_are_refused_or_bounded(engine: StarCoderEngine) -> None:
    refused = {
        "deep nesting": {"json_schema": _nested(2000)},
        "100,000-item enum": {"json_schema": {"enum": [f"value_{i}" for i in range(100_000)]}},
        "huge alternation": {"regex": "|".join(f"w{i}x" for i in range(300_000))},
    }
    for what, setting in refused.items():
        with pytest.raises(GrammarError):
            engine.generate("x = ", max_tokens=8, **setting)
        assert engine.generate("x = ", max_tokens=30, json_schema=PERSON).finish_reason == "stop", what
    # Recursion and nested quantifiers compile; decoding them is bounded per step by the limits.
    recursive = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            }
        },
        "$ref": "#/$defs/node",
    }
    for setting in ({"json_schema": recursive}, {"regex": "(a*)*(b|bb)*c{100}"}):
        done = engine.generate("x = ", max_tokens=20, temperature=1.0, seed=0, **setting)
        assert done.constrained and done.finish_reason in {"stop", "length"}


def test_a_limit_hit_while_decoding_ends_with_grammar_error(
    engine: StarCoderEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every split of "aaa..." is a parse: the Earley rows grow with each "a" until a limit stops it
    # (lowered here, so that it stops within a few tokens instead of about 160).
    monkeypatch.setitem(grammar_module.LIMITS, "max_items_in_row", 200)
    exploding = 'start: e "}}"\ne: e e e | e e | e | "a" |'
    chunks = []
    with pytest.raises(GrammarError, match="items"):
        chunks.extend(engine.stream("aaaa", max_tokens=200, grammar=exploding))
    assert chunks and "".join(c.text for c in chunks).strip("a") == ""  # decoding had begun
    assert engine.generate("x = ", max_tokens=30, json_schema=PERSON).finish_reason == "stop"


def _blanks_between_tokens(text: str) -> bool:
    """Whether JSON ``text`` has whitespace outside its strings."""
    return bool(re.search(r"\s", re.sub(r'"(?:\\.|[^"\\])*"', '""', text)))


def test_json_is_compact_unless_the_schema_asks(engine: StarCoderEngine, compiler: GrammarCompiler) -> None:
    """Whitespace cost a server answer 90 of its 105 tokens: JSON under a schema has none between its
    tokens by default (as vLLM's llguidance writes it); a schema's ``x-guidance`` may ask for some
    (llama.cpp's: a space, or newlines and an indent of up to 20)."""
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "n": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 3},
        },
        "required": ["name", "n"],
        "additionalProperties": False,
    }
    for seed in range(6):  # (random weights pad with whitespace wherever it is allowed)
        done = engine.generate("x = ", json_schema=schema, temperature=1.0, seed=seed, max_tokens=80)
        assert done.finish_reason == "stop" and not _blanks_between_tokens(done.text), done.text
    assert not allowed(compiler, "{ ", json_schema=schema) and not allowed(
        compiler, '{"name"\n', json_schema=schema
    )
    flexible = {**schema, "x-guidance": {"whitespace_flexible": True}}
    sampled = [
        engine.generate("x = ", json_schema=flexible, temperature=1.0, seed=seed, max_tokens=80).text
        for seed in range(3)
    ]
    assert any(_blanks_between_tokens(text) for text in sampled)
    assert allowed(compiler, '{\n\n  "name" : ', json_schema=flexible)
    assert not allowed(compiler, "{" + " " * 2, json_schema=flexible)  # (bounded)
    assert not allowed(compiler, "{\n" + " " * 21, json_schema=flexible)


# --- the compile cache -------------------------------------------------------------------------------


def test_compiled_once_per_constraint(engine: StarCoderEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = []
    real = grammar_module._matcher
    monkeypatch.setattr(grammar_module, "_matcher", lambda *a: compiled.append(a[1:]) or real(*a))
    schema = {"type": "object", "properties": {"q": {"type": "integer"}}, "x-guidance": COMPACT}
    for _ in range(3):
        engine.generate("x = ", max_tokens=8, json_schema=schema)
    engine.generate_batch(["x = ", "y = "], max_tokens=8, json_schema=json.dumps(schema))
    assert len(compiled) == 1
    engine.generate("x = ", max_tokens=8, regex=r"[0-9]{3}")
    assert len(compiled) == 2


def test_the_cache_is_bounded(engine: StarCoderEngine) -> None:
    compiler = GrammarCompiler(engine.tokenizer, engine.vocab_size, engine.eos_token_ids)
    first = compiler.compile(("regex", "a0"))
    for i in range(1, MAX_CACHED_GRAMMARS + 1):
        compiler.compile(("regex", f"a{i}"))
    assert len(compiler._cache) == MAX_CACHED_GRAMMARS
    assert compiler.compile(("regex", "a0")) is not first  # the oldest went first


# Heavy grammars one after another (6,000-value enums, 3 MB each compiled), RSS measured after each dozen
# (the allocator's free pages given back first, where glibc can). A child process: RSS of its own.
HEAVY = r"""
import ctypes, ctypes.util, gc, json, random, sys
import psutil
from langchain_starcoder import StarCoderEngine
from langchain_starcoder.backends import grammar
grammar.MAX_CACHED_BYTES = 32 << 20  # (the default's 128 MiB takes longer to fill)
engine = StarCoderEngine.load(sys.argv[1])
libc = ctypes.CDLL(ctypes.util.find_library("c"))
rng = random.Random(0)

def rss():
    gc.collect()
    if hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
    return psutil.Process().memory_info().rss

def enum():
    return {"enum": ["".join(rng.choice("abcdefghij") for _ in range(8)) for _ in range(6000)]}

engine.generate("x = ", max_tokens=2, json_schema=enum())
sizes = [rss()]
for _ in range(2):
    for _ in range(12):
        engine.generate("x = ", max_tokens=2, json_schema=enum())
    sizes.append(rss())
print(json.dumps(sizes))
"""


def test_memory_after_heavy_grammars_is_bounded(tiny_path: Path) -> None:
    """Compiled grammars held the review's server at 836 MB (from 388) for good: the cache is bounded in
    bytes too. Past the bound, more heavy grammars add nothing (each dozen added about 40 MB before)."""
    result = subprocess.run(
        [sys.executable, "-c", HEAVY, str(tiny_path)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-2000:]
    start, first, second = (size / 2**20 for size in json.loads(result.stdout))
    assert second - first < 15, (start, first, second)
    assert second - start < 32 + 16, (start, first, second)
