"""No constraint crashes the process: chains of ``$ref``s or rules that overflowed llguidance's native stack
(SIGSEGV, llguidance 1.9.1) are refused with a GrammarError before they reach it, the rest compile on a
thread of a known stack whichever thread asks, and the engine goes on. The adversarial inputs run in a
child process, so that a regression crashes the child, not pytest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from adversarial_grammars import holding, ref_chain, rule_chain, token_chain, tool

from langchain_starcoder import GrammarError
from langchain_starcoder.backends import grammar_depth
from langchain_starcoder.backends.grammar_depth import MAX_DEPTH, MAX_GBNF_RULES, lark_depth, schema_depth

# The child: every case through the public API, from a thread with a small stack (512 KiB: what the
# caller's thread has must not matter), then a valid constrained answer.
CHILD = r"""
import json, sys, threading
from langchain_starcoder import ChatStarCoder, StarCoderEngine

path, cases = sys.argv[1], json.load(sys.stdin)
engine = StarCoderEngine.load(path)
chat = ChatStarCoder(engine=engine, max_tokens=8)

def run():
    for label, how, value in cases:
        try:
            if how == "bind_tools":
                chat.bind_tools([value], tool_choice="required").invoke("hi")
            elif how == "with_structured_output":
                chat.with_structured_output(value).invoke("hi")
            else:
                engine.generate("x = ", max_tokens=4, **{how: value})
            print(label, "answered", flush=True)
        except Exception as e:
            print(label, type(e).__name__, str(e)[:200].replace("\n", " "), flush=True)
    point = {"type": "object", "properties": {"x": {"type": "integer", "maximum": 9}}, "required": ["x"],
             "additionalProperties": False}
    print("after", engine.generate("x = ", max_tokens=30, json_schema=point).finish_reason, flush=True)

threading.stack_size(512 * 1024)
thread = threading.Thread(target=run)
thread.start()
thread.join()
"""


def run_child(model: Path, cases: list[tuple[str, str, Any]]) -> dict[str, str]:
    """Each case's outcome ("answered" or "GrammarError ..."), and "after": the valid answer's finish."""
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(model)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"the process died ({result.returncode}): {result.stderr[-2000:]}"
    return dict(line.split(" ", 1) for line in result.stdout.splitlines())


def test_chains_past_the_bound_are_refused_and_the_process_lives(chat_path: Path) -> None:
    cases = [
        ("refs", "json_schema", ref_chain(3000)),
        ("rules", "grammar", rule_chain(12_000)),
        ("tokens", "grammar", token_chain(12_000)),
        ("gbnf", "grammar", rule_chain(4000, gbnf=True)),
        ("lark-json", "grammar", f"start: %json {json.dumps(ref_chain(3000))}\n"),
        ("structured", "with_structured_output", {"title": "Deep", **holding(ref_chain(3000))}),
    ]
    outcomes = run_child(chat_path, cases)
    for label, *_ in cases:
        assert outcomes[label].startswith("GrammarError"), (label, outcomes[label])
        assert "too deep to compile safely" in outcomes[label] or "GBNF rules" in outcomes[label]
    assert outcomes["after"] == "stop"


def test_chains_under_the_bound_compile_whatever_the_callers_stack(chat_path: Path) -> None:
    """The review's own inputs (each crashed the process) and chains at the bound compile on the compile
    thread; decoding them may then hit a per-step limit (a GrammarError), never the stack."""
    cases = [
        ("refs", "json_schema", ref_chain(2000)),
        ("rules", "grammar", rule_chain(5000)),
        ("bound", "grammar", rule_chain(MAX_DEPTH - 2)),  # the costliest unit measured, at the bound
        ("tokens", "grammar", token_chain(MAX_DEPTH - 2)),
        ("gbnf", "grammar", rule_chain(MAX_GBNF_RULES - 2, gbnf=True)),
        # A tool's schema is in the prompt too: a chain that fits the tiny model's context (300 links
        # overflowed a 512 KiB thread).
        (
            "tool",
            "bind_tools",
            tool(
                {
                    "type": "object",
                    "properties": {"x": {"$ref": "#/$defs/d0"}},
                    "$defs": ref_chain(300)["$defs"],
                }
            ),
        ),
    ]
    outcomes = run_child(chat_path, cases)
    for label, *_ in cases:
        assert "too deep" not in outcomes[label], (label, outcomes[label])
    assert outcomes["after"] == "stop"


# --- the bound itself -------------------------------------------------------------------------------


def test_a_chain_costs_its_links_and_their_nesting() -> None:
    # Each link: one reference followed, and its target's three levels (the anyOf, its list, the $ref).
    assert schema_depth(ref_chain(1000)) - schema_depth(ref_chain(500)) == 4 * 500
    assert lark_depth(rule_chain(1000)) == 1002  # one per rule
    assert lark_depth(f"start: %json {json.dumps(ref_chain(10))}\n") == 1 + schema_depth(ref_chain(10))
    # The same target through two references counts once; a target not found counts the whole schema.
    twice = {"properties": {"a": {"$ref": "#/$defs/x"}, "b": {"$ref": "#/$defs/x"}}, "$defs": {"x": {}}}
    assert schema_depth(twice) == schema_depth({**twice, "properties": {"a": {"$ref": "#/$defs/x"}}})
    assert schema_depth({"$ref": "other.json#/x", "a": [[[]]]}) == 4 + 1 + 4


def test_strings_regexes_and_comments_do_not_count() -> None:
    plain = 'start: "a"\n'
    noisy = 'start: "(:[{" /[(:]{2}/ // a comment: ( [\n# another ( : [\n'
    assert lark_depth(plain) == lark_depth(noisy) == 1
    assert lark_depth('start: ("a" ["b"])\nB: "x"{2}\n') == 5  # two colons, ( [ and {


def test_real_schemas_and_grammars_are_far_under_the_bound() -> None:
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            }
        },
        "$ref": "#/$defs/node",
    }
    person = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array"}}}
    expression = (
        'start: expr\nexpr: term (("+" | "-") term)*\nterm: NUMBER | "(" expr ")"\nNUMBER: /[0-9]+/\n'
    )
    for need in (schema_depth(tree), schema_depth(person), lark_depth(expression)):
        assert 0 < need < MAX_DEPTH // 100


def test_the_refusal_says_what_to_do() -> None:
    with pytest.raises(GrammarError, match=r"json_schema is too deep .* \$refs"):
        grammar_depth.check_schema(ref_chain(MAX_DEPTH // 4))
    with pytest.raises(GrammarError, match="too deep"):
        grammar_depth.check_lark(rule_chain(MAX_DEPTH))
    grammar_depth.check_lark(rule_chain(MAX_DEPTH - 2))  # (at the bound: fine)
    with pytest.raises(GrammarError, match="GBNF rules"):
        grammar_depth.check_gbnf(rule_chain(MAX_GBNF_RULES, gbnf=True))
