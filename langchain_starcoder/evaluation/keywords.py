"""Keyword lists that identifier matching leaves out, as CrossCodeEval's reference code has them.

Java, C#, JavaScript and TypeScript: CrossCodeEval's ``scripts/keywords/*.txt`` (amazon-science/cceval at
25f9cab7, Apache-2.0; its TypeScript list is its JavaScript one). C, C++, Go, PHP and Ruby: the lists those
came from, Microsoft's dpu-utils (``python/dpu_utils/codeutils/keywords``, at bc4f5fa6, MIT). Python: the
running interpreter's ``keyword.kwlist`` without True and False, as both compute it.
"""

from __future__ import annotations

import keyword


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


#: CrossCodeEval's lists.
CCEVAL = {
    "csharp": _words(
        "abstract as base bool break byte case catch char checked class const continue decimal "
        "default delegate do double else enum event explicit extern finally fixed float for foreach "
        "goto if implicit in int interface internal is lock long namespace new null object operator "
        "out override params private protected public readonly ref return sbyte sealed short sizeof "
        "stackalloc static string struct switch this throw try typeof uint ulong unchecked unsafe "
        "ushort using virtual void volatile while"
    ),
    "java": _words(
        "abstract assert boolean break byte case catch char class const continue default do double "
        "else enum extends final finally float for goto if implements import instanceof int "
        "interface long native new package private protected public return short static strictfp "
        "super switch synchronized this throw throws transient try var void volatile while"
    ),
    "javascript": _words(
        "break case catch class const continue debugger default delete do else enum export extends "
        "finally for function if implements import in instanceof interface let new package private "
        "protected public return static super switch this throw try typeof var void while with "
        "yield"
    ),
    "typescript": _words(
        "break case catch class const continue debugger default delete do else enum export extends "
        "finally for function if implements import in instanceof interface let new package private "
        "protected public return static super switch this throw try typeof var void while with "
        "yield"
    ),
}
#: dpu-utils' lists for languages CrossCodeEval has none of.
DPU_UTILS = {
    "c": _words(
        "auto break case char const continue default do double else enum extern float for goto if "
        "int long register return short signed sizeof static struct switch typedef union unsigned "
        "void volatile while"
    ),
    "cpp": _words(
        "alignas alignof and and_eq asm atomic_cancel atomic_commit atomic_noexcept auto bitand "
        "bitor bool break case catch char char16_t char32_t char8_t class co_await co_return "
        "co_yield compl concept const const_cast consteval constexpr continue decltype default "
        "delete do double dynamic_cast else enum explicit export extern false float for friend goto "
        "if inline int long mutable namespace new noexcept not not_eq nullptr operator or or_eq "
        "private protected public reflexpr register reinterpret_cast requires return short signed "
        "sizeof static static_assert static_cast struct switch synchronized template this "
        "thread_local throw true try typedef typeid typename union unsigned using virtual void "
        "volatile wchar_t while xor xor_eq"
    ),
    "go": _words(
        "break case chan const continue default defer else fallthrough for func go goto if import "
        "interface map package range return select struct switch type var"
    ),
    "php": _words(
        "abstract and array break callable case catch class clone const continue declare default do "
        "echo else elseif enddeclare endfor endforeach endif endswitch endwhile extends final "
        "finally for foreach function global goto if implements include include_once instanceof "
        "insteadof interface namespace new or print private protected public require require_once "
        "return static switch throw trait try unset use var while xor yield"
    ),
    "ruby": _words(
        "alias and begin break case class def defined? do else elsif end ensure for if in module "
        "next nil not or redo rescue retry return self super then undef unless until when while "
        "yield"
    ),
}
#: Python's, as both compute it.
PYTHON = frozenset(k for k in keyword.kwlist if k not in ("True", "False"))
