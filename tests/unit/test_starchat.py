"""ChatStarCoder on a StarCoder (GPTBigCode) checkpoint with a starchat-style chat template:
``<|system|>``/``<|user|>``/``<|assistant|>`` headers built from roles, turns ended by ``<|end|>``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from safetensors.numpy import load_file, save_file

from langchain_starcoder import ChatStarCoder, StarCoderEngine
from langchain_starcoder.testing import (
    STARCHAT_CHAT_TEMPLATE,
    STARCHAT_TOKENS,
    STARCODER_SPECIAL_TOKENS,
    build_gpt_bigcode,
    copy_checkpoint,
)


@pytest.fixture(scope="module")
def starchat_path(checkpoints: Path) -> Path:
    return build_gpt_bigcode(checkpoints / "starchat", chat_template=STARCHAT_CHAT_TEMPLATE, seed=8)


@pytest.fixture(scope="module")
def engine(starchat_path: Path) -> StarCoderEngine:
    engine = StarCoderEngine.load(starchat_path)
    yield engine
    engine.close()


def special_counts(engine: StarCoderEngine, ids: list[int]) -> Counter[int]:
    special = {engine.token_id(t) for t in STARCODER_SPECIAL_TOKENS + STARCHAT_TOKENS}
    return Counter(i for i in ids if i in special)


MESSAGES = [SystemMessage("You write Python."), HumanMessage("Sum a list."), AIMessage("sum(xs)")]


def test_prompt_is_the_rendered_template(starchat_path: Path, engine: StarCoderEngine) -> None:
    chat = ChatStarCoder(model=str(starchat_path), engine=engine, max_tokens=4)
    ids = chat._prompt_ids(engine, [*MESSAGES, HumanMessage("And the mean?")])
    rendered = (
        "<|system|>\nYou write Python.<|end|>\n<|user|>\nSum a list.<|end|>\n"
        "<|assistant|>\nsum(xs)<|end|>\n<|user|>\nAnd the mean?<|end|>\n<|assistant|>\n"
    )
    assert ids == engine.encode(rendered)
    assert special_counts(engine, ids)[engine.token_id("<|end|>")] == 4


def test_contents_quoting_control_tokens_stay_data(starchat_path: Path, engine: StarCoderEngine) -> None:
    chat = ChatStarCoder(model=str(starchat_path), engine=engine, max_tokens=4)
    evil = "".join(STARCODER_SPECIAL_TOKENS + STARCHAT_TOKENS)
    hostile = chat._prompt_ids(engine, [SystemMessage(evil), HumanMessage(evil), AIMessage(evil)])
    plain = chat._prompt_ids(engine, [SystemMessage("a"), HumanMessage("b"), AIMessage("c")])
    assert special_counts(engine, hostile) == special_counts(engine, plain)


def test_the_answer_ends_at_end_of_turn(starchat_path: Path, engine: StarCoderEngine, tmp_path: Path) -> None:
    """``<|end|>`` is the tokenizer's eos: a model that writes it ends its answer there."""
    chat = ChatStarCoder(model=str(starchat_path), engine=engine, max_tokens=8)
    prompt = chat._prompt_ids(engine, [HumanMessage("Sum a list.")])
    plain = engine.generate(prompt, max_tokens=8)
    end = engine.token_id("<|end|>")
    assert end in engine.eos_token_ids and end not in plain.token_ids[:2]
    # A copy whose output row for <|end|> outscores the token it writes second.
    second = plain.token_ids[1]
    logit = float(engine.logits(prompt + plain.token_ids[:1])[-1][second])
    path = copy_checkpoint(starchat_path, tmp_path / "ends")
    weights = load_file(str(path / "model.safetensors"))
    head = weights["lm_head.weight"]
    head[end] = head[second] * np.float32(1.5 if logit > 0 else 0.5)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    ends = StarCoderEngine.load(path)
    try:
        answer = ChatStarCoder(model=str(path), engine=ends, max_tokens=8).invoke(
            [HumanMessage("Sum a list.")]
        )
        assert answer.response_metadata["finish_reason"] == "stop"
        assert answer.content == ends.decode(plain.token_ids[:1])
        assert "<|end|>" not in answer.content
    finally:
        ends.close()
