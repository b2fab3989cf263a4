"""The hole's own file cut to what repository context leaves it (evaluation.window)."""

from __future__ import annotations

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.evaluation import parse_configs
from langchain_starcoder.evaluation.window import LAYOUT_TOKENS, cut_to, in_file_room

PREFIX = "".join(f"def f{k}(x):\n    return x * {k}\n" for k in range(60)) + "value = f1("
SUFFIX = ")\n" + "".join(f"print(f{k}(2))\n" for k in range(60))


def test_the_window_keeps_whole_lines_nearest_the_hole_within_its_room(tiny_engine: StarCoderEngine) -> None:
    count = tiny_engine.count_tokens
    for room in (40, 120, 400):
        prefix, suffix = cut_to(PREFIX, SUFFIX, room, count)
        assert count(prefix) + count(suffix) <= room
        assert PREFIX.endswith(prefix) and prefix.endswith("value = f1(")  # the cursor's line kept
        assert SUFFIX.startswith(suffix) and count(suffix) <= room // 4
        assert prefix == "value = f1(" or PREFIX[: -len(prefix)].endswith("\n")  # whole lines
        assert suffix == "" or suffix.endswith("\n")
        # as much as fits: one more line of the prefix would not
        dropped = PREFIX[: len(PREFIX) - len(prefix)].splitlines(keepends=True)
        assert count(dropped[-1] + prefix) + count(suffix) > room
    assert cut_to("a = 1\n", "b\n", 100, count) == ("a = 1\n", "b\n")  # fits: unchanged


def test_the_room_is_what_the_largest_context_budget_leaves(tiny_engine: StarCoderEngine) -> None:
    window = tiny_engine.context_window
    assert in_file_room(tiny_engine, parse_configs("psm,spm"), 64, None) is None  # no context compared
    configs = parse_configs("psm,psm+repo=100,spm+repo=300")
    assert in_file_room(tiny_engine, configs, 64, None) == window - 64 - 300 - LAYOUT_TOKENS
    assert in_file_room(tiny_engine, configs, 64, 1000) == 1000 - 300 - LAYOUT_TOKENS
    assert in_file_room(object(), configs, 64, None) is None  # a target that does not say its window
    assert in_file_room(tiny_engine, configs, 64, 500) == 250  # a context budget past the prompt's: half
