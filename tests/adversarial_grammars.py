"""Constraints built to overflow a grammar compiler's native stack: chains of ``$ref``s and of rules."""

from __future__ import annotations

from typing import Any


def ref_chain(n: int) -> dict[str, Any]:
    """``d_i: anyOf [$ref d_{i+1}, "a"]``: the review's schema (2,000 links crashed the server)."""
    defs: dict[str, Any] = {
        f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"const": "a"}]} for i in range(n)
    }
    defs[f"d{n}"] = {"const": "a"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def rule_chain(n: int, *, gbnf: bool = False) -> str:
    """``r_i: r_{i+1} | "a"``, in Lark or GBNF (3,000 to 5,000 rules crashed the server)."""
    if gbnf:
        return "root ::= r0\n" + "".join(f'r{i} ::= r{i + 1} | "a"\n' for i in range(n)) + f'r{n} ::= "a"\n'
    return "start: r0\n" + "".join(f'r{i}: r{i + 1} | "a"\n' for i in range(n)) + f'r{n}: "a"\n'


def token_chain(n: int) -> str:
    """Terminals chained: llguidance builds one regex nested ``n`` deep."""
    return "start: T0\n" + "".join(f'T{i}: "a" T{i + 1} | "b"\n' for i in range(n)) + f'T{n}: "a"\n'


def holding(chain: dict[str, Any]) -> dict[str, Any]:
    """An object whose property ``x`` is ``chain`` (LangChain keeps a schema's properties, not its root's
    ``$ref``)."""
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": chain["$defs"]}


def tool(parameters: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool that takes ``parameters``."""
    return {"type": "function", "function": {"name": "deep", "description": "d", "parameters": parameters}}
