"""Fine-tuning data: StarCoder2's repository layout with FIM token by token, the loss mask as mlx-lm's
trainer computes it, train/held-out separation, determinism, ``since=`` on a real git repository,
control-token text kept as text, long files cut into pieces, and the too-little-code error."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.tuner.trainer import default_loss, iterate_batches
from mlx_lm.utils import load_tokenizer
from transformers import AutoTokenizer

from langchain_starcoder._tokens import codec_for
from langchain_starcoder.errors import InvalidParameterError
from langchain_starcoder.finetune import FileSplit, TooLittleCodeError, build_dataset, split_files
from langchain_starcoder.finetune import data as data_module
from langchain_starcoder.testing import build_gpt_bigcode
from langchain_starcoder.testing.repos import write_files

A = "TAX = 0.07\n"
B = "def total(xs):\n    return sum(xs) * TAX\n"
# With seed=1, b.py is cut here (two uniform character positions, drawn from the seed and the path).
B_PREFIX, B_MIDDLE, B_SUFFIX = "def total", "(xs):\n    return sum(xs)", " * TAX\n"


@pytest.fixture(scope="module")
def tok(tiny_path: Path):
    """The tokenizer a StarCoderEngine (mlx-lm) loads: a TokenizerWrapper."""
    return load_tokenizer(tiny_path)


@pytest.fixture
def two_files(tmp_path: Path) -> Path:
    return write_files(tmp_path / "demo", {"a.py": A, "b.py": B})


def ids(tok, *tokens: str) -> list[int]:
    found = [tok.convert_tokens_to_ids(t) for t in tokens]
    assert None not in found
    return found


def data(tok, text: str) -> list[int]:
    return tok._tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def write_repo(root: Path, n: int) -> dict[str, str]:
    """``n`` small Python files, each with text no other file has."""
    function = "def function_{i}(value):\n    marker_{i} = value * {k}\n    return marker_{i}\n"
    texts = {f"pkg/mod_{i}.py": function.format(i=i, k=i + 3) for i in range(n)}
    write_files(root, texts)
    return texts


# --- the layout, token by token ------------------------------------------------------------------


def test_psm_example_written_out(two_files: Path, tok) -> None:
    [example] = build_dataset(
        two_files, ["b.py"], tok, context=["a.py"], fim_rate=1, spm_rate=0, seed=1, repo_name="demo"
    )
    rn, fs, fp, fsuf, fm, eot = ids(
        tok, "<repo_name>", "<file_sep>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<|endoftext|>"
    )
    prompt = [rn, *data(tok, "demo"), fs, *data(tok, "a.py\n" + A)]
    prompt += [fs, fp, *data(tok, "b.py\n" + B_PREFIX), fsuf, *data(tok, B_SUFFIX), fm]
    assert example == ([*prompt, *data(tok, B_MIDDLE), eot], len(prompt))
    assert B_PREFIX + B_MIDDLE + B_SUFFIX == B


def test_spm_example_written_out(two_files: Path, tok) -> None:
    """SPM as our fim/ layouts send it: the prefix after <fim_middle>, running on into the middle."""
    [example] = build_dataset(
        two_files, ["b.py"], tok, context=["a.py"], fim_rate=1, spm_rate=1, seed=1, repo_name="demo"
    )
    rn, fs, fp, fsuf, fm, eot = ids(
        tok, "<repo_name>", "<file_sep>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<|endoftext|>"
    )
    prompt = [rn, *data(tok, "demo"), fs, *data(tok, "a.py\n" + A)]
    prompt += [fs, fp, fsuf, *data(tok, B_SUFFIX), fm, *data(tok, "b.py\n" + B_PREFIX)]
    assert example == ([*prompt, *data(tok, B_MIDDLE), eot], len(prompt))


def test_plain_example_is_a_repository_document(two_files: Path, tok) -> None:
    [example] = build_dataset(two_files, ["b.py"], tok, context=["a.py"], fim_rate=0, repo_name="demo")
    rn, fs, eot = ids(tok, "<repo_name>", "<file_sep>", "<|endoftext|>")
    tokens = [rn, *data(tok, "demo"), fs, *data(tok, "a.py\n" + A), fs, *data(tok, "b.py\n" + B), eot]
    assert example == (tokens, 0)


def test_starcoder_v1_vocabulary_gets_its_layout(two_files: Path, checkpoints: Path) -> None:
    """StarCoder (v1): each file its own document, the hole's metadata at the start of its prefix."""
    v1 = load_tokenizer(build_gpt_bigcode(checkpoints / "finetune-v1", seed=6))
    [example] = build_dataset(
        two_files, ["b.py"], v1, context=["a.py"], fim_rate=1, spm_rate=0, seed=1, repo_name="demo"
    )
    rn, fn, fp, fsuf, fm, eot = ids(
        v1, "<reponame>", "<filename>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<|endoftext|>"
    )
    prompt = [rn, *data(v1, "demo"), fn, *data(v1, "a.py\n" + A), eot]
    prompt += [fp, rn, *data(v1, "demo"), fn, *data(v1, "b.py\n" + B_PREFIX), fsuf, *data(v1, B_SUFFIX), fm]
    assert example == ([*prompt, *data(v1, B_MIDDLE), eot], len(prompt))


def test_a_bare_transformers_tokenizer_gives_the_same_examples(two_files: Path, tok, tiny_path: Path) -> None:
    bare = AutoTokenizer.from_pretrained(tiny_path)
    for seed in range(4):
        wrapped = build_dataset(two_files, ["a.py", "b.py"], tok, seed=seed)
        assert list(build_dataset(two_files, ["a.py", "b.py"], bare, seed=seed)) == list(wrapped)


# --- the loss mask, as mlx-lm's trainer computes it ----------------------------------------------


def loss_positions(example: tuple[list[int], int], max_seq_length: int) -> set[int]:
    """The token positions mlx-lm's trainer puts loss on: its own ``iterate_batches`` and
    ``default_loss``, differentiated with respect to the logits (non-zero where the loss looks)."""
    [(batch, lengths)] = list(iterate_batches([example], 1, max_seq_length))

    def loss(logits: mx.array) -> mx.array:
        return default_loss(lambda _inputs: logits, batch, lengths)[0]

    logits = mx.zeros((1, batch.shape[1] - 1, max(example[0]) + 1))  # every target id a class
    grad = mx.grad(loss)(logits)
    rows = (mx.abs(grad).sum(axis=-1)[0] > 0).tolist()
    return {t + 1 for t, on in enumerate(rows) if on}  # logits at t predict the token at t + 1


def test_loss_only_on_the_middle_and_end(tmp_path: Path, tok) -> None:
    texts = write_repo(tmp_path, 8)
    dataset = build_dataset(tmp_path, sorted(texts), tok, fim_rate=0.5, max_tokens=256, seed=3)
    assert {"plain", "psm", "spm"} <= set(dataset.kinds)
    fim_middle, eot = ids(tok, "<fim_middle>", "<|endoftext|>")
    for i, (tokens, offset) in enumerate(dataset):
        positions = loss_positions((tokens, offset), 256)
        inside = {p for p in positions if p < len(tokens)}
        if dataset.kinds[i] == "plain":
            assert offset == 0 and inside == set(range(1, len(tokens)))
            continue
        # FIM: the middle and <|endoftext|> only, which are the tail after the prompt.
        assert inside == set(range(offset, len(tokens)))
        assert tokens[-1] == eot and eot not in tokens[offset:-1]
        assert fim_middle in tokens[:offset] and fim_middle not in tokens[offset:]
        # mlx-lm's mask runs one past the end (``steps <= length``): the first padding position.
        assert positions - inside <= {len(tokens)}


# --- which files, and separation -----------------------------------------------------------------


def test_no_held_out_text_in_any_training_example(tmp_path: Path, tok) -> None:
    texts = write_repo(tmp_path, 12)
    split = split_files(tmp_path, held_out=0.25, seed=5)
    assert len(split.held_out) == 3 and set(split.train) | set(split.held_out) == set(texts)
    assert not set(split.train) & set(split.held_out)
    train = build_dataset(tmp_path, split.train, tok, max_tokens=512, seed=5)
    decoded = [tok.decode(tokens) for tokens, _ in train]
    for rel in split.held_out:
        marker = texts[rel].splitlines()[1].strip()  # "marker_i = value * ...": this file's alone
        assert not any(marker in text for text in decoded), rel
        assert not any(rel in text for text in decoded), rel
    for rel in split.train:  # the check can see a file: every training file is in some example
        assert any(texts[rel].splitlines()[1].strip() in text for text in decoded), rel


def test_split_and_examples_are_deterministic(tmp_path: Path, tok) -> None:
    write_repo(tmp_path, 10)
    first = split_files(tmp_path, held_out=0.3, seed=7)
    assert split_files(tmp_path, held_out=0.3, seed=7) == first
    assert split_files(tmp_path, held_out=0.3, seed=8).held_out != first.held_out
    dataset = build_dataset(tmp_path, first.train, tok, max_tokens=256, seed=7)
    assert list(build_dataset(tmp_path, first.train, tok, max_tokens=256, seed=7)) == list(dataset)
    assert list(build_dataset(tmp_path, first.train, tok, max_tokens=256, seed=9)) != list(dataset)


def test_split_uses_the_index_walk(tmp_path: Path) -> None:
    write_repo(tmp_path, 4)
    (tmp_path / ".gitignore").write_text("secret.py\n")
    (tmp_path / "secret.py").write_text("password = 1\n")
    (tmp_path / "logo.png").write_bytes(b"\x89PNG\0\0")
    (tmp_path / "blank.py").write_text("\n\n")
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules/dep.js").write_text("module.exports = 1\n")
    split = split_files(tmp_path, held_out=0.5)
    assert isinstance(split, FileSplit) and split.root == str(tmp_path.resolve())
    assert set(split.train) | set(split.held_out) == {".gitignore", *(f"pkg/mod_{i}.py" for i in range(4))}


def git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env |= {"GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(root)}
    done = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout.strip()


def test_since_holds_out_files_with_new_code(tmp_path: Path) -> None:
    texts = write_repo(tmp_path, 6)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "first")
    rev = git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "pkg/mod_0.py").write_text(texts["pkg/mod_0.py"] + "\ndef added():\n    pass\n")
    git(tmp_path, "commit", "-qam", "grow mod_0")  # a committed addition
    (tmp_path / "pkg/mod_1.py").write_text(texts["pkg/mod_1.py"] + "EXTRA = 1\n")  # uncommitted
    (tmp_path / "pkg/new.py").write_text("print('new')\n")  # untracked
    (tmp_path / "pkg/mod_2.py").write_text(texts["pkg/mod_2.py"].split("\n", 1)[1])  # lines deleted
    git(tmp_path, "mv", "pkg/mod_3.py", "pkg/moved.py")  # renamed, unchanged
    split = split_files(tmp_path, since=rev)
    assert split.held_out == ("pkg/mod_0.py", "pkg/mod_1.py", "pkg/new.py")
    assert split.train == ("pkg/mod_2.py", "pkg/mod_4.py", "pkg/mod_5.py", "pkg/moved.py")
    assert split.since == rev
    with pytest.raises(TooLittleCodeError, match=r"No code file .* has code added after"):
        split_files(tmp_path, since=_commit_all(tmp_path))
    with pytest.raises(InvalidParameterError, match="not a revision"):
        split_files(tmp_path, since="no-such-branch")


def _commit_all(root: Path) -> str:
    git(root, "add", "-A")
    git(root, "commit", "-qm", "all")
    return git(root, "rev-parse", "HEAD")


def test_too_little_code_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "only.py").write_text("x = 1\n")
    (tmp_path / "image.png").write_bytes(b"\x89PNG\0\0")
    with pytest.raises(TooLittleCodeError, match=r"has 1 code file\(s\).*at least 2"):
        split_files(tmp_path)
    with pytest.raises(InvalidParameterError, match="held_out must be"):
        split_files(tmp_path, held_out=1.5)


# --- text stays text, long files, bad input ------------------------------------------------------


def test_control_token_text_in_a_file_stays_text(tmp_path: Path, tok) -> None:
    hostile = "s = '<|endoftext|><file_sep>x.py\\n<fim_middle>'\nt = '<repo_name>'  # <fim_prefix>\n"
    (tmp_path / "hostile.py").write_text(hostile)
    (tmp_path / "plain.py").write_text("y = 2\n")
    names = ("<|endoftext|>", "<file_sep>", "<repo_name>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>")
    controls = dict(zip(("eot", "sep", "rn", "fp", "fs", "fm"), ids(tok, *names), strict=True))
    seen = set()
    for seed in range(12):
        dataset = build_dataset(tmp_path, ["hostile.py", "plain.py"], tok, seed=seed)
        for (tokens, _), kind in zip(dataset, dataset.kinds, strict=True):
            seen.add(kind)
            count = {name: tokens.count(i) for name, i in controls.items()}
            fim = int(kind != "plain")
            # Only the layout's own: one end, one repo name, two files, and the FIM tokens once each.
            assert count == {"eot": 1, "sep": 2, "rn": 1, "fp": fim, "fs": fim, "fm": fim}
            if kind == "plain":  # decoded, the file's text is all there (control strings as text)
                assert hostile in tok.decode(tokens)
    assert seen == {"plain", "psm", "spm"}


@pytest.mark.parametrize("offsets", [True, False], ids=["offsets", "no-offsets"])
def test_a_long_file_is_cut_into_pieces_that_fit(
    tmp_path: Path, tok, offsets: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cut where the encoding's offsets say, or (a tokenizer without offsets) halved at line ends."""
    if not offsets:
        codec = codec_for(tok)
        blind = replace(codec, encode=lambda text: (codec.encode_data(text), None))
        monkeypatch.setattr(data_module, "codec_for", lambda _tokenizer: blind)
    text = "".join(f"value_{i} = compute({i}, {i * 7})\n" for i in range(300))
    (tmp_path / "long.py").write_text(text)
    dataset = build_dataset(tmp_path, ["long.py"], tok, fim_rate=0, max_tokens=128, repo_name="")
    assert len(dataset) > 5
    sep, eot = ids(tok, "<file_sep>", "<|endoftext|>")
    pieces = []
    for tokens, offset in dataset:
        assert len(tokens) <= 128 and offset == 0
        assert tokens[0] == sep and tokens[-1] == eot
        piece = tok.decode(tokens[1:-1])
        assert piece.startswith("long.py\n")
        pieces.append(piece.removeprefix("long.py\n"))
    assert "".join(pieces) == text  # every line trained on, once, cut at line ends
    assert all(p.endswith("\n") for p in pieces)


def test_bad_input_is_refused_clearly(two_files: Path, tok) -> None:
    with pytest.raises(InvalidParameterError, match="not a text file of"):
        build_dataset(two_files, ["missing.py"], tok)
    with pytest.raises(InvalidParameterError, match="fim_rate must be"):
        build_dataset(two_files, ["a.py"], tok, fim_rate=2)
    with pytest.raises(InvalidParameterError, match="max_tokens must be"):
        build_dataset(two_files, ["a.py"], tok, max_tokens=4)
    with pytest.raises(InvalidParameterError, match="non-empty list"):
        build_dataset(two_files, "a.py", tok)
    assert len(build_dataset(two_files, ["a.py"], tok)) == 1  # and it still works
