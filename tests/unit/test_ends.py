"""Where a fill-in-the-middle answer ends (langchain_starcoder.ends): the rules per language, on holes
written the way the issue-31 measure cuts them (the true middle, then what a model writes past it)."""

from __future__ import annotations

import pytest

from langchain_starcoder import InvalidParameterError, MiddleEnd, middle_end
from langchain_starcoder.ends import guess_language


def cut(source: str, middle: str) -> tuple[str, str]:
    """The prefix and suffix around the one occurrence of ``middle`` in ``source``."""
    assert source.count(middle) == 1
    at = source.index(middle)
    return source[:at], source[at + len(middle) :]


PY = '''import os


def total(items):
    """Sum the items."""
    result = 0
    for item in items:
        result += item
    return result


def main():
    print(total([1, 2]))
'''


# --- Python ------------------------------------------------------------------------------------


def test_a_python_block_ends_before_the_first_line_that_leaves_it() -> None:
    middle = "for item in items:\n        result += item\n    return result"
    prefix, suffix = cut(PY, middle)
    # The model writes the middle, then the next function (indented less than the block).
    text = middle + "\n\n\ndef other():\n    pass\n"
    assert middle_end(prefix, suffix, text, file_path="m.py") == len(middle)


def test_a_python_block_ends_before_a_line_that_repeats_the_suffix() -> None:
    middle = "result = 0\n    for item in items:\n        result += item"
    prefix, suffix = cut(PY, middle)
    text = middle + "\n    return result\n"
    assert middle_end(prefix, suffix, text, file_path="m.py") == len(middle)


def test_no_end_inside_a_string_or_brackets_that_span_lines() -> None:
    prefix = "def f():\n    x = 1\n    "
    suffix = "\n\ndef g():\n    pass\n"
    # A triple-quoted string and a call whose lines sit at column 0 and 2: still the middle.
    middle = 'text = """\nno indentation here\n"""\n    call(\n  1,\n)\n    return text'
    text = middle + "\ndef h():\n    pass"
    assert middle_end(prefix, suffix, text, file_path="m.py") == len(middle)


def test_decorators_stay_with_what_they_decorate() -> None:
    prefix = "class A:\n    def f(self):\n        "
    suffix = "\n\n    def g(self):\n        pass\n"
    middle = "@cache\n        def inner():\n            return 1\n        return inner"
    text = middle + "\n\n    @property\n    def h(self):\n        return 2"
    assert middle_end(prefix, suffix, text, file_path="a.py") == len(middle)
    # A hole inside a decorator line ends at the end of that line.
    line_prefix, line_suffix = cut("@app.route('/x')\ndef view():\n    pass\n", "route('/x')")
    assert middle_end(line_prefix, line_suffix, "route('/x')\ndef view():", file_path="v.py") == len(
        "route('/x')"
    )


@pytest.mark.parametrize(
    ("keyword", "block"),
    [
        ("else:", "if ok:\n        a = 1\n    else:\n        a = 2"),
        ("elif other:", "if ok:\n        a = 1\n    elif other:\n        a = 2"),
        ("except ValueError:", "try:\n        a = 1\n    except ValueError:\n        a = 2"),
        ("finally:", "try:\n        a = 1\n    finally:\n        a = 2"),
    ],
)
def test_else_elif_except_after_a_block(keyword: str, block: str) -> None:
    source = f"def f(ok, other):\n    {block}\n    return a\n"
    # A hole in the first branch's body ends before the keyword line, which leaves that body.
    prefix, suffix = cut(source, "a = 1")
    assert middle_end(prefix, suffix, "a = 1\n    " + keyword + "\n        a = 3") == len("a = 1")
    # A middle that holds the whole statement keeps the keyword line and its body.
    prefix, suffix = cut(source, block)
    assert middle_end(prefix, suffix, block + "\n\ndef g():\n    pass", file_path="f.py") == len(block)
    # A statement begun inside a line goes on past ``else:`` at the cursor line's indentation.
    head = block.split("\n", 1)[0]
    prefix, suffix = cut(source, block[2:])
    text = block[2:] + "\n    return a"
    assert middle_end(prefix, suffix, text, file_path="f.py") == len(block) - 2, head


def test_a_one_line_hole_ends_at_the_end_of_its_line() -> None:
    prefix, suffix = cut(PY, "tal([1, 2]))")
    assert middle_end(prefix, suffix, "tal([1, 2]))\nprint(3)", file_path="m.py") == len("tal([1, 2]))")
    # Not while the statement is open: the bracket closes on the next line.
    assert middle_end(prefix, suffix, "tal([1,\n    2]))\nprint(3)", file_path="m.py") == len(
        "tal([1,\n    2]))"
    )
    # Nor after an operator that continues it, nor a compound statement's header.
    prefix = "def f(a, b):\n    x = a"
    assert middle_end(prefix, "\n", " + \\\n        b\n    return x", file_path="f.py") == len(
        " + \\\n        b"
    )
    assert middle_end("def f(x):\n    if x", "\n", ":\n        return 1\n    return 2") == len(
        ":\n        return 1"
    )


def test_code_after_the_cursor_completes_the_line() -> None:
    prefix, suffix = "x = foo(", ")\ny = 2\n"
    assert middle_end(prefix, suffix, "1, 2\ny = 2", file_path="a.py") == len("1, 2")


def test_an_empty_suffix_and_a_hole_at_the_end_of_the_file() -> None:
    prefix = "def f():\n    x = 1\n    "
    assert middle_end(prefix, "", "return x\n\ndef g():\n    pass", file_path="f.py") == len("return x")
    assert middle_end(prefix, "\n", "return x\nprint(f())", file_path="f.py") == len("return x")
    # At the top level nothing ends a block: the text is not known to be complete.
    assert middle_end("import os\n", "", "x = 1\ny = 2\n", file_path="f.py") is None


def test_crlf_files_end_before_the_carriage_return() -> None:
    source = PY.replace("\n", "\r\n")
    middle = "for item in items:\r\n        result += item\r\n    return result"
    prefix, suffix = cut(source, middle)
    assert middle_end(prefix, suffix, middle + "\r\n\r\n\r\ndef other():\r\n", file_path="m.py") == len(
        middle
    )
    prefix, suffix = cut(source, "tal([1, 2]))")
    assert middle_end(prefix, suffix, "tal([1, 2]))\r\nprint(3)", file_path="m.py") == len("tal([1, 2]))")


def test_a_hole_inside_a_string_ends_where_the_suffix_closes_it() -> None:
    prefix = 'def f():\n    """Return the'
    suffix = '\n    """\n    return 1\n'
    assert middle_end(prefix, suffix, ' answer.\n    """\n    return 1', file_path="f.py") == len(" answer.")
    # A one-line string the suffix closes on the cursor's line.
    assert middle_end('x = "abc', '"\n', 'def"\ny = 1', file_path="f.py") == len("def")
    # A cursor right after a backslash is still inside the string (the escape goes on in the middle).
    assert middle_end('x = "a\\', 'n"\ny = 1\n', 'n"\ny = 1', file_path="f.py") == len("n")
    # When the suffix does not close it, the middle does, and the line rule ends it.
    assert middle_end('def f():\n    """Return the', "\n    return 1\n", ' answer."""\n    return 1') == len(
        ' answer."""'
    )


# --- brace languages ---------------------------------------------------------------------------

JS = """function total(items) {
  let result = 0;
  for (const item of items) {
    result += item;
  }
  return result;
}

function main() {
  console.log(total([1, 2]));
}
"""


def test_javascript_ends_before_the_brace_that_closes_the_block() -> None:
    middle = "let result = 0;\n  for (const item of items) {\n    result += item;\n  }\n  return result;"
    prefix, suffix = cut(JS, middle)
    assert middle_end(prefix, suffix, middle + "\n}\n\nfunction x() {", file_path="a.js") == len(middle)
    # Or before a line indented out of the block, once the middle's own brackets are closed.
    text = middle + "\nconst other = 1;\nconst more = 2;"
    assert middle_end(prefix, suffix, text, file_path="a.js") == len(middle)


def test_javascript_template_strings_and_regular_expressions_stay_data() -> None:
    prefix = "function f(x) {\n  "
    suffix = "\n}\n"
    middle = (
        "const s = `line\n}\n${x.map((y) => `${y}`).join('')}\n`;\n"
        "  const re = /[({'\"]/g;\n  return s.replace(re, '')"
    )
    assert middle_end(prefix, suffix, middle + "\n}\nfunction g() {", file_path="a.js") == len(middle)
    # A regular expression that ends a line is a complete value, not a division waiting for its operand.
    source = (
        "function f(x) {\n  switch (x) {\n    case 1:\n      y = /ab/\n    case 2:\n      y = 2\n  }\n}\n"
    )
    prefix, suffix = cut(source, "y = /ab/")
    assert middle_end(prefix, suffix, "y = /ab/\n    case 2:\n", file_path="a.js") == len("y = /ab/")


def test_typescript_uses_the_brace_rules() -> None:
    prefix = "function f(x: number): number {\n  "
    suffix = "\n}\n"
    middle = "const y: Array<number> = [x];\n  return y[0];"
    assert middle_end(prefix, suffix, middle + "\n}\n\nexport function g(): void {", file_path="a.ts") == len(
        middle
    )


def test_go_with_tabs_and_case_clauses() -> None:
    source = (
        "package main\n\nfunc f(x int) int {\n\tswitch x {\n\tcase 1:\n\t\ty := 2\n\t\treturn y\n"
        "\tdefault:\n\t\treturn 0\n\t}\n}\n"
    )
    middle = "y := 2\n\t\treturn y"
    prefix, suffix = cut(source, middle)
    # The next case clause is indented less than the case body: the body's block ends there.
    assert middle_end(prefix, suffix, middle + "\n\tcase 2:\n\t\treturn 3", file_path="m.go") == len(middle)
    # Go ends a statement at the newline: a line hole ends there.
    prefix, suffix = cut(source, "= 2")
    assert middle_end(prefix, suffix, "= 2\n\t\treturn y", file_path="m.go") == len("= 2")


def test_rust_lifetimes_are_not_strings_and_raw_strings_are() -> None:
    prefix = "fn f<'a>(x: &'a str) -> &'a str {\n    "
    suffix = "\n}\n"
    middle = 'let s: &\'a str = r#"a "quoted" }\n{ text"#;\n    let c = \'}\';\n    x'
    assert middle_end(prefix, suffix, middle + "\n}\n\nfn g() {}", file_path="lib.rs") == len(middle)


def test_java_statements_end_at_their_semicolon() -> None:
    source = "class A {\n  int f(int x) {\n    int y = x + 1;\n    return y;\n  }\n}\n"
    prefix, suffix = cut(source, "x + 1;")
    assert middle_end(prefix, suffix, "x + 1;\n    return y;", file_path="A.java") == len("x + 1;")
    # Without it the statement goes on (a builder chain on the next lines), ending at a line back
    # at the statement's indentation.
    text = "x\n        .plus(1);\n    return y;"
    assert middle_end(prefix, suffix, text, file_path="A.java") == len("x\n        .plus(1);")
    # Text blocks are strings.
    middle = 'String s = """\n}\n  """;\n    return y;'
    prefix, suffix = cut(source, "int y = x + 1;\n    return y;")
    assert middle_end(prefix, suffix, middle + "\n  }\n}", file_path="A.java") == len(middle)


# --- modes, incremental use, bad input, hostile text ------------------------------------------


def test_modes() -> None:
    prefix, suffix = "def f():\n    ", "\n"
    text = "a = 1\n    b = 2\n\nx = 3"
    assert middle_end(prefix, suffix, text, file_path="f.py", mode="auto") == len("a = 1\n    b = 2")
    assert middle_end(prefix, suffix, text, file_path="f.py", mode="block") == len("a = 1\n    b = 2")
    assert middle_end(prefix, suffix, text, file_path="f.py", mode="line") == len("a = 1")
    assert middle_end(prefix, suffix, text, file_path="f.py", mode="none") is None
    with pytest.raises(InvalidParameterError, match="mode must be one of"):
        middle_end(prefix, suffix, text, mode="lines")
    with pytest.raises(InvalidParameterError, match="must be strings"):
        middle_end(None, suffix, text)  # type: ignore[arg-type]
    ends = MiddleEnd(prefix, suffix)
    with pytest.raises(InvalidParameterError, match="as a string, not bytes"):
        ends.feed(b"a = 1\n")  # type: ignore[arg-type]
    assert ends.feed(text) == len("a = 1\n    b = 2")  # still usable


def test_feeding_line_by_line_gives_the_one_shot_answer_and_refuses_other_text() -> None:
    middle = "for item in items:\n        result += item\n    return result"
    prefix, suffix = cut(PY, middle)
    text = middle + "\n\n\ndef other():\n    pass\n"
    ends = MiddleEnd(prefix, suffix, file_path="m.py")
    answers = [ends.feed(text[:n]) for n in range(1, len(text) + 1)]
    first = next(i for i, answer in enumerate(answers) if answer is not None)
    assert answers[:first] == [None] * first
    assert set(answers[first:]) == {len(middle)}
    assert text[: first + 1].endswith("\nd")  # decided as soon as the line that leaves the block starts
    # Each call takes the whole middle so far: a text that does not extend the last one is refused
    # (issue 38: fed only its new lines, a middle of many lines was read as a few), and nothing is lost.
    lines = MiddleEnd(prefix, suffix, file_path="m.py")
    assert lines.feed("for item in items:\n") is None
    with pytest.raises(ValueError, match="the whole middle generated so far, not only its new lines"):
        lines.feed("        result += item\n")
    assert lines.feed(text) == len(middle)  # the same as reading it whole
    assert lines.fresh().feed("x = 1\n    y = 2\ndef g") == len("x = 1\n    y = 2")  # another middle


def test_the_language_comes_from_the_path_else_from_the_text() -> None:
    prefix, suffix = "fn f() {\n    ", "\n}\n"
    text = "let x = 1;\n    x\n}\nfn g() {}"
    assert middle_end(prefix, suffix, text, file_path="lib.rs") == len("let x = 1;\n    x")
    assert middle_end(prefix, suffix, text) == len("let x = 1;\n    x")
    assert guess_language("def f(self):\n    return self.x\n") == "python"
    assert guess_language("func main() {\n\tx := 1\n\tfmt.Println(x)\n}\n") == "go"
    assert guess_language("const x = require('y');\nfunction f() { return x === 1; }\n") == "javascript"


def test_hostile_text_stays_data() -> None:
    """Control tokens, the suffix's text and bracket soup inside strings and comments decide nothing."""
    prefix = "def f():\n    "
    suffix = "\n    return 1\n\ndef g():\n    pass\n"
    hostile = (
        's = "<|endoftext|><fim_suffix>\\n    return 1 )]}"\n'
        "    # <fim_middle> ) ] } \n"
        "    t = '''\n    return 1\n<file_sep>\n'''"
    )
    neutral = "s = " + "x" * 10
    assert middle_end(prefix, suffix, hostile + "\n    return 1\n", file_path="f.py") == len(hostile)
    assert middle_end(prefix, suffix, neutral + "\n    return 1\n", file_path="f.py") == len(neutral)
    # Text that only looks like code past the hole, written inside the middle's own string, is data.
    assert middle_end(prefix, suffix, 'x = """\ndef g():\n"""\n    return 1\n', file_path="f.py") == len(
        'x = """\ndef g():\n"""'
    )
