"""An mlx-lm adapter served by a real vLLM (its CPU build, in ``.venv-vllm``) with ``--enable-lora``, from
``export-adapter --peft``'s folder: vLLM 0.32 runs StarCoder2 through its Transformers backend, which
declares SupportsLoRA, and applies the adapter. Its log-probs are MLX's with the adapter unfused and
fused (1e-4, float32; measured 5e-6), its greedy tokens MLX's; ``connect(..., adapter=NAME)`` runs every
request with it, its prefix cache kept apart from the base's; a name the server does not serve as an
adapter of the model, or an adapter on a server that is not vLLM, is one clear error.

One vLLM server for the module, its own (the session's serves no adapter)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import mlx.core as mx
import numpy as np
import pytest

from langchain_starcoder import StarCoderEngine, StarCoderLLM
from langchain_starcoder.backends.remote import ServerError
from langchain_starcoder.errors import InvalidParameterError
from langchain_starcoder.finetune.export import fuse_adapter, to_peft
from langchain_starcoder.loading import load_model
from langchain_starcoder.loading.adapter import apply_adapter, read_adapter
from langchain_starcoder.testing.adapters import build_adapter
from langchain_starcoder.testing.gguf import LlamaServer, write_gguf
from langchain_starcoder.testing.vllm_server import VLLMServer

PROMPTS = ([5, 17, 300, 42, 901, 7], list(range(100, 160)), [3, 3, 3, 800, 801])
VOCAB = 1024  # the small preset's: every token's log-prob comes back
NAME = "ad"  # the adapter's name on the server


@pytest.fixture(scope="module")
def files(vllm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The adapter, its PEFT folder (what vLLM loads) and the fused checkpoint."""
    root = tmp_path_factory.mktemp("lora-vllm")
    adapter = build_adapter(vllm_path, root / "adapter", rank=4, scale=2.0, strength=0.05)
    return {
        "adapter": adapter,
        "peft": to_peft(adapter, root / "peft", model_dir=vllm_path),
        "fused": fuse_adapter(vllm_path, adapter, root / "fused"),
    }


@pytest.fixture(scope="module")
def server(vllm_path: Path, files: dict[str, Path], pytestconfig: pytest.Config) -> Iterator[VLLMServer]:
    """vLLM serving the base as "tiny" and the adapter as NAME over it, every log-prob returnable."""
    server = VLLMServer(
        vllm_path, venv=pytestconfig.rootpath / ".venv-vllm", log=files["peft"].with_name("vllm.log")
    )
    server.args += ["--enable-lora", "--lora-modules", f"{NAME}={files['peft']}", "--max-lora-rank", "8"]
    server.args += ["--max-logprobs", str(VOCAB)]
    try:
        server.start()
        yield server
    finally:
        server.stop()


def vllm_logprobs(server: VLLMServer, model: str, ids: list[int]) -> np.ndarray:
    """vLLM's log-probabilities of every next token after each prefix of ``ids`` (its raw ones: the
    prompt's positions from ``prompt_logprobs``, the last from the first generated token's)."""
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": VOCAB,
        "prompt_logprobs": VOCAB,
        "return_tokens_as_token_ids": True,  # keys "token_id:N": tokens of the same text stay apart
    }
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=300)
    response.raise_for_status()
    choice = response.json()["choices"][0]
    out = np.full((len(ids), VOCAB), np.nan)
    for row, position in zip(out[:-1], choice["prompt_logprobs"][1:], strict=True):
        for token, entry in position.items():
            row[int(token)] = entry["logprob"]
    for token, logprob in choice["logprobs"]["top_logprobs"][0].items():
        out[-1, int(token.removeprefix("token_id:"))] = logprob
    assert not np.isnan(out).any()
    return out


def mlx_model(model: Path, adapter: Path | None = None) -> object:
    """The float32 MLX model, with the adapter unfused."""
    loaded = load_model(model, quantize=None, group_size=64, dtype="float32")
    if adapter is not None:
        apply_adapter(loaded.model, loaded.args, read_adapter(adapter), str(model))
    return loaded.model


def mlx_logprobs(model: object, ids: list[int]) -> np.ndarray:
    logits = np.array(model(mx.array([ids]))[0], dtype=np.float64)  # type: ignore[operator]
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


@pytest.mark.vllm
def test_vllm_with_the_adapter_is_mlx_unfused_and_fused(
    vllm_path: Path, files: dict[str, Path], server: VLLMServer
) -> None:
    adapted, fused, base = (
        mlx_model(vllm_path, files["adapter"]),
        mlx_model(files["fused"]),
        mlx_model(vllm_path),
    )
    for ids in PROMPTS:
        got, plain = vllm_logprobs(server, NAME, ids), vllm_logprobs(server, "tiny", ids)
        np.testing.assert_allclose(plain, mlx_logprobs(base, ids), atol=1e-4)
        assert np.abs(got - plain).max() > 0.3  # the adapter acts
        np.testing.assert_allclose(got, mlx_logprobs(adapted, ids), atol=1e-4)
        np.testing.assert_allclose(got, mlx_logprobs(fused, ids), atol=1e-4)


@pytest.fixture(scope="module")
def local(vllm_path: Path, files: dict[str, Path]) -> Iterator[StarCoderEngine]:
    engine = StarCoderEngine.load(vllm_path, adapter_path=files["adapter"])
    yield engine
    engine.close()


@pytest.mark.vllm
def test_the_engine_connected_with_the_adapter_decodes_as_mlx_does(
    vllm_path: Path, server: VLLMServer, local: StarCoderEngine
) -> None:
    engine = StarCoderEngine.connect(server.url, model="tiny", tokenizer=vllm_path, adapter=NAME)
    base = StarCoderEngine.connect(server.url, model="tiny", tokenizer=vllm_path)
    try:
        assert engine.backend.adapter_name == NAME
        for prompt in (*PROMPTS[:2], "def value_index(self, count=None):\n"):
            got, want = engine.generate(prompt, max_tokens=16), local.generate(prompt, max_tokens=16)
            assert (got.text, got.token_ids) == (want.text, want.token_ids)
            assert base.generate(prompt, max_tokens=16).token_ids != want.token_ids  # not the base's
    finally:
        engine.close()
        base.close()


@pytest.mark.vllm
def test_the_langchain_wrapper_names_the_served_adapter(
    vllm_path: Path, server: VLLMServer, local: StarCoderEngine
) -> None:
    llm = StarCoderLLM(
        model="tiny", base_url=server.url, tokenizer=str(vllm_path), adapter=NAME, max_tokens=16
    )
    prompt = "def value_index(self, count=None):\n"
    assert llm.invoke(prompt) == local.generate(prompt, max_tokens=16).text
    assert llm.engine.backend.adapter_name == NAME


@pytest.mark.vllm
def test_the_adapter_and_the_base_never_share_cached_prompts(vllm_path: Path, server: VLLMServer) -> None:
    """vLLM keys its prefix cache by the adapter: a prompt the base cached is prefilled anew under the
    adapter, then reused under it."""
    engine = StarCoderEngine.connect(server.url, model="tiny", tokenizer=vllm_path, adapter=NAME)
    base = StarCoderEngine.connect(server.url, model="tiny", tokenizer=vllm_path)
    try:
        prompt = list(range(200, 500))
        base.generate(prompt, max_tokens=1)
        assert base.generate(prompt, max_tokens=1).cached_tokens > 200
        assert engine.generate(prompt, max_tokens=1).cached_tokens == 0
        assert engine.generate(prompt, max_tokens=1).cached_tokens > 200
    finally:
        engine.close()
        base.close()


@pytest.mark.vllm
def test_a_name_the_server_does_not_serve_as_an_adapter_is_a_clear_error(
    vllm_path: Path, server: VLLMServer, local: StarCoderEngine
) -> None:
    connect = {"model": "tiny", "tokenizer": vllm_path, "max_retries": 0}
    with pytest.raises(ServerError, match=r"not the adapter 'other'.*--lora-modules other=PEFT_DIR.*--fused"):
        StarCoderEngine.connect(server.url, adapter="other", **connect)
    with pytest.raises(ServerError, match=r"'tiny' on .* is a model, not an adapter"):
        StarCoderEngine.connect(server.url, adapter="tiny", **connect)
    with pytest.raises(InvalidParameterError, match=r"adapter_path is for a model loaded here.*adapter=NAME"):
        StarCoderEngine.connect(server.url, adapter_path=vllm_path, **connect)
    with pytest.raises(InvalidParameterError, match="adapter must be the name"):
        StarCoderEngine.connect(server.url, adapter="", **connect)
    engine = StarCoderEngine.connect(server.url, adapter=NAME, **connect)  # the server is as it was
    try:
        assert engine.generate("def f():", max_tokens=8).text == local.generate("def f():", max_tokens=8).text
    finally:
        engine.close()


def test_an_adapter_on_a_llama_cpp_server_is_refused_naming_what_runs_it(
    clean_path: Path, tmp_path: Path
) -> None:
    """llama-server's adapters are its own (``--lora``): a vLLM adapter name there is refused."""
    with LlamaServer(write_gguf(clean_path, tmp_path / "tiny.gguf"), alias="tiny") as server:
        with pytest.raises(
            InvalidParameterError, match=r'is not vLLM.*backend="llama.cpp", adapter_path.*--fused'
        ):
            StarCoderEngine.connect(server.url, model="tiny", tokenizer=clean_path, adapter=NAME)
        engine = StarCoderEngine.connect(server.url, model="tiny", tokenizer=clean_path)
        engine.close()
