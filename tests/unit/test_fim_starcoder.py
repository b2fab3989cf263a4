"""FIM for StarCoder (v1) vocabularies: the metadata layout by token id, chosen by vocabulary, user
text as data (hostile text), budgets, and stops at the family's control tokens."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from langchain_starcoder import ContextLengthError, FIMRequest, RepoIndex, StarCoderEngine
from langchain_starcoder.fim import (
    FIM_STOP_TOKENS,
    STARCODER_METADATA_TOKENS,
    ContextFile,
    MissingFIMTokensError,
    build_fim_prompt,
    fim_stop_token_ids,
)
from langchain_starcoder.testing import (
    SPECIAL_TOKENS,
    STARCODER_SPECIAL_TOKENS,
    build_gpt_bigcode,
    copy_checkpoint,
)

PREFIX = "def total(order):\n    "
SUFFIX = "\n    return result\n"
FILES = [
    ContextFile(
        "shop/models.py", "class Order:\n    lines: list\n\n    def add(self, line):\n        pass\n"
    ),
    ContextFile("", "TAX = 0.07\n"),
]


@pytest.fixture(scope="module")
def v1_path(checkpoints: Path) -> Path:
    return build_gpt_bigcode(checkpoints / "fim-v1", seed=6)


@pytest.fixture(scope="module")
def v1(v1_path: Path) -> StarCoderEngine:
    engine = StarCoderEngine.load(v1_path)
    yield engine
    engine.close()


def ids_of(engine: StarCoderEngine, *tokens: str) -> list[int]:
    out = [engine.token_id(t) for t in tokens]
    assert None not in out
    return out


def data(engine: StarCoderEngine, text: str) -> list[int]:
    return engine.encode(text, special_tokens=False)


def v1_layout(engine, prefix, suffix, files, repo_name, file_path, mode="psm") -> list[int]:
    """The expected ids of StarCoder's layout, written out from the special token ids: each file a
    document ``<reponame>{repo}<filename>{path}\\n{code}<|endoftext|>``, then the hole's document."""
    rn, fn, eot, fp, fs, fm = ids_of(
        engine, "<reponame>", "<filename>", "<|endoftext|>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"
    )

    def metadata(path: str) -> tuple[list[int], str]:  # control/name ids, and the text that opens the code
        if path:
            return ([rn, *data(engine, repo_name)] if repo_name else []) + [fn], f"{path}\n"
        return ([rn], f"{repo_name}\n") if repo_name else ([], "")

    out: list[int] = []
    for f in files:
        head_ids, head = metadata(f.path)
        out += [*head_ids, *data(engine, head + f.text), eot]
    head_ids, head = metadata(file_path or "")
    hole = [*head_ids, *data(engine, head + prefix)]
    if mode == "psm":
        return [*out, fp, *hole, fs, *data(engine, suffix), fm]
    return [*out, fp, fs, *data(engine, suffix), fm, *hole]


# --- layout --------------------------------------------------------------------------------------


def test_the_metadata_layout_written_out(v1: StarCoderEngine) -> None:
    rn, fn, eot, fp, fs, fm = ids_of(
        v1, "<reponame>", "<filename>", "<|endoftext|>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"
    )
    prompt = build_fim_prompt(
        v1, PREFIX, SUFFIX, context_files=FILES, repo_name="acme/shop", file_path="shop/orders.py"
    )
    models_py = [rn, *data(v1, "acme/shop"), fn, *data(v1, "shop/models.py\n" + FILES[0].text), eot]
    tax = [rn, *data(v1, "acme/shop\n" + FILES[1].text), eot]  # no path: the newline follows the name
    hole = [fp, rn, *data(v1, "acme/shop"), fn, *data(v1, "shop/orders.py\n" + PREFIX)]
    assert prompt.token_ids == [*models_py, *tax, *hole, fs, *data(v1, SUFFIX), fm]
    assert prompt.layout == "starcoder" and prompt.repo_level
    assert prompt.text == (
        "<reponame>acme/shop<filename>shop/models.py\n" + FILES[0].text + "<|endoftext|>"
        "<reponame>acme/shop\n" + FILES[1].text + "<|endoftext|>"
        "<fim_prefix><reponame>acme/shop<filename>shop/orders.py\n"
        + PREFIX
        + "<fim_suffix>"
        + SUFFIX
        + "<fim_middle>"
    )
    assert v1.decode(prompt.token_ids) == prompt.text
    assert v1.token_id("<file_sep>") is None and v1.token_id("<repo_name>") is None


@pytest.mark.parametrize("mode", ["psm", "spm"])
@pytest.mark.parametrize("files", [[], FILES], ids=["no_files", "files"])
@pytest.mark.parametrize("repo_name", [None, "acme/shop"])
@pytest.mark.parametrize("file_path", [None, "shop/orders.py"])
def test_metadata_layout(v1: StarCoderEngine, mode, files, repo_name, file_path) -> None:
    prompt = build_fim_prompt(
        v1, PREFIX, SUFFIX, context_files=files, repo_name=repo_name, file_path=file_path, mode=mode
    )
    if not (files or repo_name or file_path):  # plain FIM, as for StarCoder2
        fp, fs, fm = ids_of(v1, "<fim_prefix>", "<fim_suffix>", "<fim_middle>")
        pre, suf = data(v1, PREFIX), data(v1, SUFFIX)
        assert prompt.token_ids == ([fp, *pre, fs, *suf, fm] if mode == "psm" else [fp, fs, *suf, fm, *pre])
        assert prompt.layout == "fim"
        return
    assert prompt.token_ids == v1_layout(v1, PREFIX, SUFFIX, files, repo_name, file_path, mode)
    assert prompt.layout == "starcoder"


def test_layout_is_chosen_by_vocabulary(v1: StarCoderEngine, tiny_engine: StarCoderEngine) -> None:
    """The same request gets each family's layout from its tokenizer alone (no model name involved)."""
    kwargs = dict(context_files=FILES, repo_name="acme/shop", file_path="a.py")
    assert build_fim_prompt(v1.tokenizer, PREFIX, SUFFIX, **kwargs).layout == "starcoder"
    assert build_fim_prompt(tiny_engine.tokenizer, PREFIX, SUFFIX, **kwargs).layout == "starcoder2"
    bare = _tokenizer_with(["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<filename>"])
    prompt = build_fim_prompt(bare, "a", "b", file_path="x.py")
    assert prompt.layout == "starcoder"
    assert prompt.token_ids[:2] == bare.convert_tokens_to_ids(["<fim_prefix>", "<filename>"])
    with pytest.raises(MissingFIMTokensError, match="<reponame>"):
        build_fim_prompt(bare, "a", "b", repo_name="acme/shop")


def _tokenizer_with(special: list[str]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["def f(x):\n    return x\n"] * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def test_repository_context_from_an_index_gets_the_metadata_layout(
    v1: StarCoderEngine, tmp_path: Path
) -> None:
    """The files an index adds are documents of their own, as given files are: the layout writes
    their ``<filename>`` and ``<|endoftext|>`` although the request itself had no files."""
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "models.py").write_text(FILES[0].text)
    prefix = "from shop.models import Order\n\norder = Order()\norder."
    request = FIMRequest(prefix, SUFFIX, file_path="shop/orders.py", repo=RepoIndex(tmp_path))
    prompt = v1.fim_prompt(request, 16)
    assert prompt.files_kept and {f.path for f in prompt.files_kept} == {"shop/models.py"}
    expected = v1_layout(v1, prefix, SUFFIX, prompt.files_kept, None, "shop/orders.py")
    assert prompt.token_ids == expected and prompt.layout == "starcoder"
    assert v1.infill(request, max_tokens=2).completion_tokens > 0


# --- user text is data, budgets -----------------------------------------------------------------

hostile = st.lists(
    st.one_of(
        st.text(max_size=12),
        st.sampled_from(STARCODER_SPECIAL_TOKENS + SPECIAL_TOKENS),
        st.sampled_from(["<", ">", "|", "\n"]),
    ),
    max_size=8,
).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefix=hostile, suffix=hostile, code=hostile, path=hostile, repo=hostile, file_path=hostile)
def test_hostile_text_stays_data(
    v1: StarCoderEngine, prefix: str, suffix: str, code: str, path: str, repo: str, file_path: str
) -> None:
    tid = v1.token_id
    special = {tid(t) for t in STARCODER_SPECIAL_TOKENS}
    prompt = build_fim_prompt(
        v1,
        prefix,
        suffix,
        context_files=[ContextFile(path, code), ContextFile("b.py", code)],
        repo_name=repo,
        file_path=file_path,
    )
    files = prompt.files_kept
    expected = Counter(
        {
            tid("<reponame>"): (len(files) + 1) if repo else 0,
            tid("<filename>"): sum(bool(f.path) for f in files) + bool(file_path),
            tid("<|endoftext|>"): len(files),
        }
        | {tid(t): 1 for t in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")}
    )
    assert Counter(i for i in prompt.token_ids if i in special) == +expected


_TEXT = st.text(alphabet=st.sampled_from("ab \n<>|_xyz"), max_size=60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prefix=_TEXT,
    suffix=_TEXT,
    files=st.lists(st.tuples(st.sampled_from(["", "a.py", "pkg/<filename>.py"]), _TEXT), max_size=3),
    repo_name=st.sampled_from([None, "acme/shop", "<reponame>x"]),
    file_path=st.sampled_from([None, "src/main.py"]),
    mode=st.sampled_from(["psm", "spm"]),
    budget=st.integers(min_value=1, max_value=90),
)
def test_budget_keeps_the_layout(v1, prefix, suffix, files, repo_name, file_path, mode, budget) -> None:
    files = [ContextFile(f"{i}{p}" if p else "", t) for i, (p, t) in enumerate(files)]
    kwargs = dict(context_files=files, repo_name=repo_name, file_path=file_path, mode=mode)
    try:
        prompt = build_fim_prompt(v1, prefix, suffix, max_prompt_tokens=budget, **kwargs)
    except ContextLengthError:
        fixed = (
            v1_layout(v1, "", "", [], repo_name, file_path, mode) if files or repo_name or file_path else []
        )
        assert len(fixed) > budget or budget < 3
        return
    assert len(prompt.token_ids) <= budget
    kept_prefix = prefix[len(prefix) - prompt.prefix_chars_kept :]
    kept_suffix = suffix[: prompt.suffix_chars_kept]
    if prompt.layout == "starcoder":
        expected = v1_layout(v1, kept_prefix, kept_suffix, prompt.files_kept, repo_name, file_path, mode)
        assert prompt.token_ids == expected
    assert v1.decode(prompt.token_ids) == prompt.text


# --- stops ---------------------------------------------------------------------------------------


def test_stop_tokens_are_the_familys(v1: StarCoderEngine, tiny_engine: StarCoderEngine) -> None:
    expected = [v1.token_id(t) for t in FIM_STOP_TOKENS + STARCODER_METADATA_TOKENS]
    assert fim_stop_token_ids(v1) == tuple(i for i in expected if i is not None)
    assert {v1.token_id(t) for t in STARCODER_METADATA_TOKENS} <= set(fim_stop_token_ids(v1))
    # StarCoder2's vocabulary has none of the v1 metadata tokens: its stops are unchanged.
    assert fim_stop_token_ids(tiny_engine) == tuple(tiny_engine.token_id(t) for t in FIM_STOP_TOKENS)


@pytest.mark.parametrize("token", ["<filename>", "<reponame>", "<gh_stars>", "<|endoftext|>"])
def test_infill_stops_at_metadata_tokens(
    v1: StarCoderEngine, v1_path: Path, tmp_path: Path, token: str
) -> None:
    """A copy of the model whose output row for ``token`` is a scaled copy of the row of the token
    it writes second, so that the model itself writes ``token`` at step 1 (or sooner)."""
    kwargs = dict(context_files=FILES, repo_name="acme/shop", file_path="shop/orders.py")
    prompt = build_fim_prompt(v1, PREFIX, SUFFIX, **kwargs)
    plain = v1.generate(prompt.token_ids, max_tokens=6)
    assert not set(fim_stop_token_ids(v1)).intersection(plain.token_ids[:2])  # it writes text first
    second = plain.token_ids[1]
    logit = float(v1.logits(prompt.token_ids + plain.token_ids[:1])[-1][second])
    path = copy_checkpoint(v1_path, tmp_path / "emit")
    weights = load_file(str(path / "model.safetensors"))
    head = weights["lm_head.weight"]
    head[v1.token_id(token)] = head[second] * np.float32(1.5 if logit > 0 else 0.5)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    engine = StarCoderEngine.load(path)
    try:
        control = engine.token_id(token)
        emitted = engine.generate(prompt.token_ids, max_tokens=6)
        assert control in emitted.token_ids[:2]
        at = emitted.token_ids.index(control)
        middle = engine.infill(PREFIX, SUFFIX, max_tokens=6, trim_suffix_overlap=False, **kwargs)
        assert middle.finish_reason == "stop"
        assert middle.token_ids == emitted.token_ids[: at + 1]
        assert token not in middle.text
    finally:
        engine.close()
