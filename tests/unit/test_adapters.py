"""Fine-tuning adapters as a load option (issue 41): every path that loads a model takes one, its
output is mlx-lm's for the same adapter, the prompt cache never serves KV of one adapter (or none) to
another, and a bad adapter is refused with an error that says what is wrong, leaving the process usable."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from langchain_starcoder import ChatStarCoder, StarCoderEngine, StarCoderLLM
from langchain_starcoder._registry import release_engines
from langchain_starcoder.backends.prompt_cache.disk import MIN_NEW_TOKENS
from langchain_starcoder.cli import main
from langchain_starcoder.cli.options import load_settings
from langchain_starcoder.cli.parser import build_parser
from langchain_starcoder.cli.serve_adapters import split_adapters
from langchain_starcoder.errors import CheckpointError, InvalidParameterError, ModelNotFoundError
from langchain_starcoder.loading.adapter import BASE_KEY, CONFIG_FILE, WEIGHTS_FILE
from langchain_starcoder.testing import build_starcoder2
from langchain_starcoder.testing.adapters import build_adapter
from langchain_starcoder.types import CachePartition

PROMPT = "def area(radius):\n    return"
IDS = [5, 70, 300, 12, 900, 44, 2, 650]
#: Long enough for a prompt-cache file of its own on disk.
LONG = "".join(f"def handler_{i}(request):\n    return respond(request, code={i * 7})\n" for i in range(36))


@pytest.fixture(scope="module")
def adapters(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    built = {
        method: build_adapter(tiny_path, root / method, method=method) for method in ("lora", "dora", "full")
    }
    built["zero"] = build_adapter(tiny_path, root / "zero", scale=0.0)
    small = build_starcoder2(root / "small-base", preset="small")
    built["small"] = build_adapter(small, root / "small")
    return built


@pytest.fixture(scope="module")
def lora_engine(tiny_path: Path, adapters: dict[str, Path]) -> Iterator[StarCoderEngine]:
    engine = StarCoderEngine.load(tiny_path, adapter_path=adapters["lora"])
    yield engine
    engine.close()


def bad_copy(adapters: dict[str, Path], tmp_path: Path, name: str = "lora") -> Path:
    return Path(shutil.copytree(adapters[name], tmp_path / f"bad-{name}"))


# --- what the model computes with an adapter ----------------------------------------------------


@pytest.mark.parametrize("method", ["lora", "dora", "full"])
def test_the_logits_are_mlx_lms_for_the_same_adapter(
    tiny_path: Path,
    adapters: dict[str, Path],
    tiny_engine: StarCoderEngine,
    method: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unfused, as mlx-lm's own loader and model apply the adapter to the same checkpoint (float32)."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx_lm.models.starcoder2
    from mlx_lm import load

    # mlx-lm's StarCoder2 computes the erf GELU where the config says gelu_pytorch_tanh (its base
    # differs from the config's model by 7.5e-4 here): give its module the config's activation.
    monkeypatch.setattr(mlx_lm.models.starcoder2.nn, "gelu", nn.gelu_approx)
    engine = StarCoderEngine.load(tiny_path, adapter_path=adapters[method], dtype="float32")
    try:
        ours = engine.logits(IDS)
        model, _ = load(str(tiny_path), adapter_path=str(adapters[method]))
        theirs = np.array(model(mx.array(IDS)[None]).astype(mx.float32)[0])
        np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
        assert np.abs(ours - tiny_engine.logits(IDS)).max() > 0.05  # the adapter does change them
        assert engine.adapter.fine_tune_type == method and engine.adapter.path == adapters[method]
    finally:
        engine.close()


def test_an_adapter_at_scale_0_is_the_base(
    tiny_path: Path, adapters: dict[str, Path], tiny_engine: StarCoderEngine
) -> None:
    engine = StarCoderEngine.load(tiny_path, adapter_path=adapters["zero"])
    try:
        np.testing.assert_allclose(engine.logits(IDS), tiny_engine.logits(IDS), atol=1e-6, rtol=0)
        assert engine.generate(PROMPT, max_tokens=12).text == tiny_engine.generate(PROMPT, max_tokens=12).text
    finally:
        engine.close()


# --- the prompt cache -------------------------------------------------------------------------------


def test_base_and_adapter_never_share_prompt_caches_on_disk(
    tiny_path: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    """Two engines over one folder: each reuses its own files (in a new engine, its memory empty)
    and never the other's, and answers as it does with no cache at all."""
    fresh = {}
    for name, adapter in (("base", None), ("lora", adapters["lora"])):
        engine = StarCoderEngine.load(tiny_path, adapter_path=adapter)
        fresh[name] = engine.generate(LONG, max_tokens=8).text
        engine.close()
    assert fresh["base"] != fresh["lora"]

    def run(name: str) -> tuple[str, int]:
        adapter = adapters["lora"] if name == "lora" else None
        engine = StarCoderEngine.load(tiny_path, adapter_path=adapter, prompt_cache_dir=tmp_path)
        try:
            completion = engine.generate(LONG, max_tokens=8)
        finally:
            engine.close()  # (its queued write lands first)
        return completion.text, completion.cached_tokens

    assert run("base") == (fresh["base"], 0)
    assert run("lora") == (fresh["lora"], 0)  # the base's file is not read for the adapter
    assert len(list(tmp_path.glob("*.safetensors"))) == 2
    for name in ("lora", "base"):
        text, cached = run(name)
        assert text == fresh[name] and cached > MIN_NEW_TOKENS  # its own file, reused
    assert len(list(tmp_path.glob("*.safetensors"))) == 2


def test_the_adapter_is_part_of_the_partition() -> None:
    """A partition's digest names its adapter; a salt's alone is what files were keyed by before."""
    import hashlib

    salted = CachePartition("a")
    assert salted.digest == hashlib.blake2b(b'{"salt":"a"}', digest_size=16).hexdigest()
    adapted = {
        CachePartition(adapter="x").digest,
        CachePartition("a", "x").digest,
        CachePartition("a", "y").digest,
    }
    assert len(adapted | {salted.digest, CachePartition().digest}) == 5
    assert not CachePartition(adapter="x").is_default


def test_prompt_cache_reuse_is_unchanged_with_an_adapter(lora_engine: StarCoderEngine) -> None:
    first = lora_engine.generate(PROMPT, max_tokens=6, cache_salt="reuse")
    again = lora_engine.generate(PROMPT, max_tokens=6, cache_salt="reuse")
    assert (first.cached_tokens, again.cached_tokens) == (0, len(lora_engine.encode(PROMPT)) - 1)
    assert again.text == first.text


# --- every path that loads a model -----------------------------------------------------------------


def test_the_wrappers_take_an_adapter(
    tiny_path: Path, adapters: dict[str, Path], lora_engine: StarCoderEngine
) -> None:
    from langchain_starcoder.llama_index import StarCoder

    expected = lora_engine.generate(PROMPT, max_tokens=8).text
    try:
        llm = StarCoderLLM(model=str(tiny_path), adapter_path=adapters["lora"], max_tokens=8)
        assert llm.invoke(PROMPT) == expected
        assert llm.engine.adapter.path == adapters["lora"]
        assert StarCoderLLM(model=str(tiny_path), max_tokens=8).invoke(PROMPT) != expected
        chat = ChatStarCoder(model=str(tiny_path), adapter_path=str(adapters["lora"]))
        assert chat.engine is llm.engine  # one engine per (model, adapter)
        index_llm = StarCoder(model=str(tiny_path), adapter_path=str(adapters["lora"]), max_tokens=8)
        assert index_llm.complete(PROMPT).text == expected
    finally:
        release_engines()


def test_the_command_line_takes_an_adapter(
    tiny_path: Path,
    adapters: dict[str, Path],
    lora_engine: StarCoderEngine,
    capsys: pytest.CaptureFixture[str],
) -> None:
    load = ["--model", str(tiny_path), "--adapter", str(adapters["lora"]), "--max-tokens", "8"]
    expected = lora_engine.generate(PROMPT, max_tokens=8).text
    assert main(["generate", "--prompt", PROMPT, *load]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(expected) and f"lora adapter {adapters['lora']}" in err
    middle = lora_engine.infill("def f(x):\n    ", "\n    return y\n", max_tokens=8).text
    hole = ["--prefix", "def f(x):\\n    ", "--suffix", "\\n    return y\\n", "--no-repo"]
    assert main(["infill", *hole, *load]) == 0
    assert capsys.readouterr().out.startswith(middle)
    serve = build_parser().parse_args(["serve", "--adapter", str(adapters["lora"])])
    serve.adapter, named = split_adapters(serve.adapter)  # (as serve reads it: one bare DIR, no names)
    assert load_settings(serve)["adapter_path"] == adapters["lora"] and named == {}  # the same load path


def test_an_adapter_folder_with_a_served_model_is_refused_naming_adapter_name(
    tiny_path: Path, adapters: dict[str, Path]
) -> None:
    with pytest.raises(InvalidParameterError, match=r"adapter_path is for a model loaded here.*adapter=NAME"):
        StarCoderEngine.connect("http://127.0.0.1:9", model=str(tiny_path), adapter_path=adapters["lora"])
    with pytest.raises(ValueError, match=r"with base_url the model runs on the server.*adapter=NAME"):
        StarCoderLLM(model="m", base_url="http://127.0.0.1:9", adapter_path=str(adapters["lora"]))
    with pytest.raises(ValueError, match=r"\['adapter'\] needs base_url"):  # a served adapter's name
        StarCoderLLM(model=str(tiny_path), adapter="ad")


# --- bad adapters -------------------------------------------------------------------------------------


def refused(tiny_path: Path, adapter: Path, error: type[Exception], pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        StarCoderEngine.load(tiny_path, adapter_path=adapter)


def test_a_missing_or_incomplete_adapter_folder(
    tiny_path: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    refused(tiny_path, tmp_path / "nowhere", ModelNotFoundError, "adapter folder .*nowhere does not exist")
    bad = bad_copy(adapters, tmp_path)
    (bad / WEIGHTS_FILE).unlink()
    refused(tiny_path, bad, ModelNotFoundError, f"has no {WEIGHTS_FILE}.*finetune")
    (bad / CONFIG_FILE).write_text("{not json")
    shutil.copy(adapters["lora"] / WEIGHTS_FILE, bad / WEIGHTS_FILE)
    refused(tiny_path, bad, CheckpointError, f"{CONFIG_FILE} is not valid JSON")


def test_a_truncated_adapter_file(tiny_path: Path, adapters: dict[str, Path], tmp_path: Path) -> None:
    bad = bad_copy(adapters, tmp_path)
    data = (bad / WEIGHTS_FILE).read_bytes()
    (bad / WEIGHTS_FILE).write_bytes(data[: len(data) - 100])
    refused(tiny_path, bad, CheckpointError, f"{WEIGHTS_FILE} .* is damaged: .*truncated")


def test_an_adapter_of_another_base_names_both(
    tiny_path: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    """By the base it records, and, where it records none (mlx_lm.lora's), by its tensors' shapes."""
    both = r"hidden size 256, 2 layers, vocabulary 1024.*is starcoder2, hidden size 64, 2 layers, vocab"
    refused(tiny_path, adapters["small"], CheckpointError, both)
    bad = bad_copy(adapters, tmp_path, "small")
    config = json.loads((bad / CONFIG_FILE).read_text())
    del config[BASE_KEY]
    (bad / CONFIG_FILE).write_text(json.dumps(config))
    refused(
        tiny_path,
        bad,
        CheckpointError,
        r"shape \[256, 4\], where .* needs \[64, 4\]: it was trained on another base",
    )
    vocabulary = bad_copy(adapters, tmp_path)
    config = json.loads((vocabulary / CONFIG_FILE).read_text())
    config[BASE_KEY]["vocab_size"] = 49152
    (vocabulary / CONFIG_FILE).write_text(json.dumps(config))
    refused(tiny_path, vocabulary, CheckpointError, "vocabulary 49152.*vocabulary 1024")


def test_an_adapter_of_another_architecture(
    tiny_path: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    import mlx.core as mx

    bad = bad_copy(adapters, tmp_path)
    tensors = mx.load(str(bad / WEIGHTS_FILE))
    renamed = {n.replace("mlp.c_fc", "mlp.gate_proj"): t for n, t in tensors.items()}
    mx.save_safetensors(str(bad / WEIGHTS_FILE), renamed)
    config = json.loads((bad / CONFIG_FILE).read_text())
    del config[BASE_KEY]
    (bad / CONFIG_FILE).write_text(json.dumps(config))
    refused(
        tiny_path, bad, CheckpointError, r"adapts modules .* does not have .*gate_proj.*another architecture"
    )


def test_a_rank_or_target_module_mismatch(tiny_path: Path, adapters: dict[str, Path], tmp_path: Path) -> None:
    bad = bad_copy(adapters, tmp_path)
    config = json.loads((bad / CONFIG_FILE).read_text())
    (bad / CONFIG_FILE).write_text(
        json.dumps({**config, "lora_parameters": {**config["lora_parameters"], "rank": 8}})
    )
    refused(tiny_path, bad, CheckpointError, r"says rank 8, but .* of rank 4")
    fewer = {**config["lora_parameters"], "keys": ["self_attn.q_proj"]}
    (bad / CONFIG_FILE).write_text(json.dumps({**config, "lora_parameters": fewer}))
    refused(tiny_path, bad, CheckpointError, r"tensors for .*which its adapter_config.json does not target")
    narrow = build_adapter(tiny_path, tmp_path / "narrow", keys=["self_attn.q_proj"])
    config = json.loads((narrow / CONFIG_FILE).read_text())
    config["lora_parameters"]["keys"] = ["self_attn.q_proj", "self_attn.v_proj"]
    (narrow / CONFIG_FILE).write_text(json.dumps(config))
    refused(
        tiny_path, narrow, CheckpointError, r"targets 2 modules its adapters.safetensors has no tensors for"
    )


def test_a_refused_adapter_leaves_the_process_usable(
    tiny_path: Path, adapters: dict[str, Path], lora_engine: StarCoderEngine, tmp_path: Path
) -> None:
    before = lora_engine.generate(PROMPT, max_tokens=6).text
    refused(tiny_path, adapters["small"], CheckpointError, "trained on")
    with pytest.raises(CheckpointError):
        StarCoderLLM(model=str(tiny_path), adapter_path=str(adapters["small"])).invoke(PROMPT)
    assert lora_engine.generate(PROMPT, max_tokens=6).text == before
    llm = StarCoderLLM(model=str(tiny_path), adapter_path=str(adapters["lora"]), max_tokens=6)
    try:
        assert llm.invoke(PROMPT) == before  # a failed load is not remembered
    finally:
        release_engines()
