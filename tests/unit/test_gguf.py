"""GGUF files (llama.cpp, Ollama): written offline with llama.cpp's own ``gguf`` package from the test
checkpoints, then loaded, compared with their sources, converted, and broken on purpose."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path
from unittest import mock

import gguf
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from langchain_starcoder import StarCoderEngine, StarCoderLLM, cli
from langchain_starcoder.errors import (
    CheckpointError,
    InvalidParameterError,
    ModelNotFoundError,
    StarCoderError,
    UnsupportedModelError,
)
from langchain_starcoder.gguf_format import GGUFNotice
from langchain_starcoder.gguf_format.layout import expected_shapes, our_name
from langchain_starcoder.loading import expected_tensors, model_args, read_config
from langchain_starcoder.testing import (
    GPT_BIGCODE_PRESETS,
    SPECIAL_TOKENS,
    STARCODER_SPECIAL_TOKENS,
    build_gpt_bigcode,
    build_starcoder2,
)
from langchain_starcoder.testing.gguf import write_gguf

REPO = Path(__file__).resolve().parents[2]
WINDOW = 512  # the tiny preset's sliding window, which GGUF files do not carry
PROMPT = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
)


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory, tiny_path: Path) -> dict[str, Path]:
    """The tiny checkpoint as GGUF files of each type; "Q4_0" and "Q4_1" mix in a Q8_0 token
    embedding, as llama-quantize's files do."""
    out = tmp_path_factory.mktemp("gguf")
    files = {ft: write_gguf(tiny_path, out / f"tiny-{ft}.gguf", ftype=ft) for ft in ("F32", "F16", "Q8_0")}
    for ftype in ("Q4_0", "Q4_1"):
        files[ftype] = write_gguf(
            tiny_path, out / f"tiny-{ftype}.gguf", ftype=ftype, types={"token_embd": "Q8_0"}
        )
    return files


def load(path: Path, **kwargs) -> StarCoderEngine:
    kwargs.setdefault("sliding_window", WINDOW)
    return StarCoderEngine.load(path, **kwargs)


def prompt_ids(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(40, 1024, size=n).tolist()


def relative_error(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


def dequantized_checkpoint(file: Path, source: Path, dst: Path) -> Path:
    """The GGUF's weights dequantized by the ``gguf`` package, as a Hugging Face checkpoint of the
    source's config (names mapped back with gguf's own name map): the reference for a quantized file."""
    config = json.loads((source / "config.json").read_text())
    if config["model_type"] == "gpt_bigcode":
        names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.STARCODER, config["n_layer"])
    else:
        names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.STARCODER2, config["num_hidden_layers"])
    hf_names = {}
    for name in mx.load(str(source / "model.safetensors")):
        base, _, suffix = name.rpartition(".")
        hf_names[f"{names.get_name(base)}.{suffix}"] = name
    weights = {}
    for tensor in gguf.GGUFReader(file).tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        weights[hf_names[tensor.name]] = mx.array(values.reshape(tuple(reversed(tensor.shape.tolist()))))
    dst.mkdir()
    for f in source.glob("*.json"):
        shutil.copy(f, dst / f.name)
    mx.save_safetensors(str(dst / "model.safetensors"), weights, metadata={"format": "pt"})
    return dst


def transformers_logits(path: Path, ids: list[int]) -> np.ndarray:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


# --- parity ------------------------------------------------------------------------------------------


def test_float32_gguf_matches_its_safetensors(ggufs: dict[str, Path], tiny_engine: StarCoderEngine) -> None:
    engine = load(ggufs["F32"])
    try:
        ids = prompt_ids(64)
        assert np.abs(engine.logits(ids) - tiny_engine.logits(ids)).max() < 1e-4
        ours = engine.generate(PROMPT, max_tokens=32)
        ref = tiny_engine.generate(PROMPT, max_tokens=32)
        assert ours.token_ids == ref.token_ids and ours.completion_tokens == 32
        assert engine.context_window == tiny_engine.context_window
        assert engine.backend.raw_config["norm_epsilon"] == 1e-5  # not float32's 9.99e-06
    finally:
        engine.close()


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_0", "Q4_1"])
def test_quantized_gguf_matches_its_dequantized_weights(
    ggufs: dict[str, Path], tiny_path: Path, tmp_path: Path, ftype: str
) -> None:
    """Q8_0/Q4_0 stay quantized (MLX group-32 layers, each tensor with its own type's bits) and
    compute what transformers computes with the same weights dequantized by the ``gguf`` package."""
    engine = load(ggufs[ftype])
    try:
        model = engine.backend.model
        q = model.model.layers[0].self_attn.q_proj
        assert isinstance(q, nn.QuantizedLinear) and q.group_size == 32 and q.bits == int(ftype[1])
        embed = model.model.embed_tokens
        assert isinstance(embed, nn.QuantizedEmbedding) and embed.bits == 8  # Q8_0 in both files
        assert q.scales.dtype == mx.float32  # dtype="auto" on the CPU, as for safetensors
        ids = prompt_ids(48)
        ref = transformers_logits(dequantized_checkpoint(ggufs[ftype], tiny_path, tmp_path / "ref"), ids)
        assert np.abs(engine.logits(ids) - ref).max() < 1e-4
    finally:
        engine.close()


def test_tied_embeddings_quantized(tmp_path: Path) -> None:
    """Without an ``output`` tensor the (quantized) token embedding is the output layer too."""
    source = build_starcoder2(tmp_path / "tied", tie_word_embeddings=True, seed=3)
    file = write_gguf(source, tmp_path / "tied.gguf", ftype="Q8_0")
    assert "output.weight" not in {t.name for t in gguf.GGUFReader(file).tensors}
    engine = load(file)
    try:
        assert engine.backend.raw_config["tie_word_embeddings"] is True
        assert isinstance(engine.backend.model.model.embed_tokens, nn.QuantizedEmbedding)
        ids = prompt_ids(32)
        ref = transformers_logits(dequantized_checkpoint(file, source, tmp_path / "ref"), ids)
        assert np.abs(engine.logits(ids) - ref).max() < 1e-4
    finally:
        engine.close()


def test_quantization_error_next_to_mlx_quantization(
    ggufs: dict[str, Path], tiny_path: Path, tiny_engine: StarCoderEngine
) -> None:
    """Relative logit error of the Q8_0 and Q4_0 files against the float32 model, reported next to
    MLX's own 8-bit and 4-bit quantization (group 64, and 32 like GGUF): the same order."""
    ids = prompt_ids(64)
    ref = tiny_engine.logits(ids)
    errors = {}
    for name, kwargs in {
        "gguf Q8_0": dict(file=ggufs["Q8_0"]),
        "gguf Q4_0": dict(file=ggufs["Q4_0"]),
        "mlx 8-bit g64": dict(quantize=8),
        "mlx 8-bit g32": dict(quantize=8, group_size=32),
        "mlx 4-bit g64": dict(quantize=4),
        "mlx 4-bit g32": dict(quantize=4, group_size=32),
    }.items():
        file = kwargs.pop("file", None)
        engine = load(file) if file else StarCoderEngine.load(tiny_path, **kwargs)
        errors[name] = relative_error(engine.logits(ids), ref)
        engine.close()
    print("relative logit error vs float32:", {k: f"{v:.4f}" for k, v in errors.items()})
    assert errors["gguf Q8_0"] < 2 * errors["mlx 8-bit g64"]
    assert errors["gguf Q4_0"] < 2 * errors["mlx 4-bit g64"]
    assert errors["gguf Q8_0"] < errors["gguf Q4_0"]


def test_f16_and_bf16_weights_are_read_exactly(tiny_path: Path, tmp_path: Path) -> None:
    """F16 as it is; BF16 exactly, also where float16 cannot hold it (mx.load's own BF16 path goes
    through float16: 1e-7 would be rounded, 7e4 would overflow)."""
    source = shutil.copytree(tiny_path, tmp_path / "src")
    weights = dict(mx.load(str(source / "model.safetensors")))
    norm = np.array(weights["model.norm.weight"])
    norm[:3] = [1e-7, 7e4, -3.1e-6]
    weights["model.norm.weight"] = mx.array(norm)
    mx.save_safetensors(str(source / "model.safetensors"), weights, metadata={"format": "pt"})
    for ftype in ("F16", "BF16"):
        file = write_gguf(
            source,
            tmp_path / f"{ftype}.gguf",
            ftype=ftype,
            types={"output_norm.weight": "BF16"} if ftype == "BF16" else None,
        )
        engine = load(file, dtype="float32")
        try:
            model = engine.backend.model
            target = mx.float16 if ftype == "F16" else mx.bfloat16
            expected = weights["model.layers.1.mlp.c_fc.weight"].astype(target).astype(mx.float32)
            assert mx.array_equal(model.model.layers[1].mlp.c_fc.weight, expected)
            assert mx.array_equal(model.model.norm.bias, weights["model.norm.bias"])  # 1-D stays F32
            if ftype == "BF16":
                assert mx.array_equal(model.model.norm.weight, weights["model.norm.weight"].astype(target))
                assert model.model.norm.weight[1].item() > 6.9e4 and model.model.norm.weight[0].item() > 0
        finally:
            engine.close()


def test_dtype_applies_as_for_safetensors(ggufs: dict[str, Path]) -> None:
    engine = load(ggufs["F16"], dtype="float16")
    try:
        assert engine.backend.model.model.layers[0].self_attn.q_proj.weight.dtype == mx.float16
    finally:
        engine.close()
    engine = load(ggufs["F16"])  # auto: float32 compute on the CPU
    try:
        assert engine.backend.model.model.layers[0].self_attn.q_proj.weight.dtype == mx.float32
    finally:
        engine.close()


def test_quantize_on_load_of_a_float_file_only(ggufs: dict[str, Path], tiny_path: Path) -> None:
    engine = load(ggufs["F32"], quantize=8)
    try:
        assert isinstance(engine.backend.model.model.layers[0].mlp.c_fc, nn.QuantizedLinear)
    finally:
        engine.close()
    with pytest.raises(InvalidParameterError, match="already quantized"):
        load(ggufs["Q8_0"], quantize=4)


# --- K-quants and other types ---------------------------------------------------------------------


def test_k_quants_are_dequantized_with_a_notice_of_their_memory(
    tiny_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Q6_K / Q4_K (a Q4_K_M file's types): MLX reads them as float16, we keep that and say what it
    costs. The values are gguf's dequantization, to float16's rounding."""
    file = write_gguf(
        tiny_path,
        tmp_path / "k.gguf",
        types={"blk.0.ffn_down.weight": "Q6_K", "blk.1.ffn_down.weight": "Q4_K"},
    )
    with pytest.warns(GGUFNotice, match=r"2 tensors of type Q4_K/Q6_K are dequantized.*GB in memory"):
        engine = load(file)
    try:
        reader = {t.name: t for t in gguf.GGUFReader(file).tensors}
        for i in (0, 1):
            t = reader[f"blk.{i}.ffn_down.weight"]
            ref = gguf.quants.dequantize(t.data, t.tensor_type)
            ours = np.array(engine.backend.model.model.layers[i].mlp.c_proj.weight)
            assert ours.shape == ref.shape == (64, 256)
            np.testing.assert_allclose(ours, ref, rtol=1e-3, atol=1e-7)
        assert engine.generate(PROMPT, max_tokens=4).completion_tokens >= 1
    finally:
        engine.close()
    # convert writes them as float16, saying so (and the window it assumed) in one line each
    assert cli.main(["convert", str(file), str(tmp_path / "out")]) == 0
    notes = [
        line for line in capsys.readouterr().err.splitlines() if line.startswith("langchain-starcoder: note:")
    ]
    assert len(notes) == 2 and "dequantized" in notes[1] and "4096" in notes[0]
    written = mx.load(str(tmp_path / "out" / "model.safetensors"))
    assert written["model.layers.1.mlp.c_proj.weight"].dtype == mx.float16
    assert "quantization" not in json.loads((tmp_path / "out" / "config.json").read_text())


def test_other_types_are_refused_with_the_supported_list(
    tiny_path: Path, tmp_path: Path, ggufs: dict[str, Path]
) -> None:
    file = write_gguf(tiny_path, tmp_path / "q5.gguf", ftype="Q8_0", types={"blk.1.attn_v": "Q5_0"})
    with pytest.raises(UnsupportedModelError) as info:
        load(file)
    message = str(info.value)
    assert "blk.1.attn_v.weight is of type Q5_0" in message
    for supported in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"):
        assert supported in message
    load(ggufs["Q8_0"]).close()  # the next load works


# --- tokenizer ---------------------------------------------------------------------------------------


def corpus_lines() -> list[str]:
    """A few hundred lines of mixed code and prose: this package's sources (code, docstrings, the
    control-token strings they mention), its README, and some unicode."""
    lines = []
    for file in sorted((REPO / "langchain_starcoder").glob("*.py"))[:8]:
        lines += file.read_text(encoding="utf-8").splitlines()[:60]
    lines += (REPO / "README.md").read_text(encoding="utf-8").splitlines()[:100]
    lines += [
        "// 你好世界 🚀 café naïve façade — “quotes” ✓",
        "x = 12345678901234567890  # digits",
        "\t\tindented\twith tabs  and  spaces   ",
        "<fim_prefix>def f():<fim_suffix>\n<fim_middle>",
        "text with <|endoftext|> and <file_sep>path\n inside",
        "<repo_name>owner/repo<file_sep>a.py\n",
        "",
        " ",
        "\n\n\n",
        "ünïcödé ‰ ∑ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    ]
    return lines


def test_tokenizer_from_the_file_encodes_as_hugging_face(
    ggufs: dict[str, Path], tiny_path: Path, tiny_engine: StarCoderEngine
) -> None:
    """No tokenizer.json: the GGUF's own ``tokenizer.ggml.*`` gives exactly the ids of the model's
    Hugging Face tokenizer (its tokenizer.json, run by the ``tokenizers`` library), with control
    tokens parsed from prompts and never from data.

    (Not transformers 5's AutoTokenizer: for a ``GPT2Tokenizer`` config it swaps StarCoder's
    digits-then-byte-level pre-tokenizer for plain byte-level, so "  16" becomes two tokens.)"""
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(tiny_path / "tokenizer.json"))
    hf_data = Tokenizer.from_file(str(tiny_path / "tokenizer.json"))
    hf_data.encode_special_tokens = True
    engine = load(ggufs["Q8_0"])
    try:
        lines = corpus_lines()
        assert len(lines) > 300
        for text in [*lines, "\n".join(lines)]:
            assert engine.encode(text) == hf.encode(text, add_special_tokens=False).ids, text
            assert engine.encode(text, special_tokens=False) == hf_data.encode(text).ids, text
            assert engine.decode(engine.encode(text)) == text
        assert set(engine.tokenizer.all_special_tokens) >= set(SPECIAL_TOKENS)
        assert engine.eos_token_ids == {0}
        hostile = "x = '<file_sep>'  # <|endoftext|>"
        ids = engine.encode(hostile, special_tokens=False)
        assert not set(ids) & set(range(len(SPECIAL_TOKENS)))
        assert engine.decode(ids) == hostile
        fim = engine.fim_prompt(_fim_request(hostile))
        assert fim.token_ids == tiny_engine.fim_prompt(_fim_request(hostile)).token_ids
    finally:
        engine.close()


def _fim_request(text: str):
    from langchain_starcoder.fim.request import ContextFile, FIMRequest

    return FIMRequest(text, "\nprint(x)\n", context_files=[ContextFile("a.py", text)], repo_name="o/r")


def test_an_instruct_models_chat_template_comes_with_it(chat_path: Path, tmp_path: Path) -> None:
    from langchain_core.messages import HumanMessage, SystemMessage

    from langchain_starcoder import ChatStarCoder

    folder = StarCoderEngine.load(chat_path)
    engine = load(write_gguf(chat_path, tmp_path / "chat.gguf"))
    try:
        assert engine.tokenizer.chat_template == folder.tokenizer.chat_template is not None
        messages = [SystemMessage("Be brief."), HumanMessage("Write a sort in Python.")]
        ours = ChatStarCoder(engine=engine, max_tokens=8).invoke(messages).content
        assert ours == ChatStarCoder(engine=folder, max_tokens=8).invoke(messages).content
    finally:
        engine.close()
        folder.close()


# --- sliding window ----------------------------------------------------------------------------------


def test_sliding_window_default_notice_and_override(
    ggufs: dict[str, Path], window_path: Path, tmp_path: Path
):
    # one wording right for the library and the command line alike
    notice = (
        r"does not record StarCoder2's attention window.*4096.*pass sliding_window= \(--sliding-window on"
    )
    with pytest.warns(GGUFNotice, match=notice):
        engine = StarCoderEngine.load(ggufs["F32"])
    assert engine.sliding_window == 4096
    engine.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", GGUFNotice)  # an explicit window needs no notice
        engine = StarCoderEngine.load(ggufs["F32"], sliding_window=0)
        assert engine.sliding_window is None
        engine.close()
        # the override changes behaviour: the window-16 checkpoint's logits, past the window
        window = StarCoderEngine.load(window_path)
        engine = StarCoderEngine.load(
            write_gguf(window_path, tmp_path / "w.gguf"), sliding_window=16, dtype="float32"
        )
        ids = prompt_ids(64)
        assert engine.sliding_window == 16
        assert np.abs(engine.logits(ids) - window.logits(ids)).max() < 1e-4
        engine.close()
        window.close()
        # a file that records its window is taken at its word
        engine = StarCoderEngine.load(write_gguf(window_path, tmp_path / "w2.gguf", sliding_window=16))
        assert engine.sliding_window == 16
        engine.close()
    with pytest.raises(InvalidParameterError, match="GGUF files only"):
        StarCoderEngine.load(window_path, sliding_window=16)
    with pytest.raises(InvalidParameterError, match="sliding_window"):
        StarCoderEngine.load(ggufs["F32"], sliding_window=-1)


def test_missing_rope_base_is_llama_cpps_default_with_a_notice(tiny_path: Path, tmp_path: Path) -> None:
    source = build_starcoder2(tmp_path / "src", seed=4)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "rope_theta": 1e6}))
    with pytest.warns(GGUFNotice, match="does not record rope.freq_base; using llama.cpp's default 10000"):
        engine = load(write_gguf(source, tmp_path / "old.gguf", rope_freq_base=False))
    assert engine.backend.config.rope_base == 10000.0
    engine.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", GGUFNotice)
        engine = load(write_gguf(source, tmp_path / "new.gguf"))
    assert engine.backend.config.rope_base == 1e6  # starcoder2.rope.freq_base, as written
    engine.close()


# --- where the file comes from -------------------------------------------------------------------------


def test_gguf_file_in_a_folder_and_on_the_hub(ggufs: dict[str, Path], tmp_path: Path) -> None:
    folder = ggufs["Q8_0"].parent
    engine = load(folder, gguf_file=ggufs["Q8_0"].name)
    assert engine.path == ggufs["Q8_0"]
    engine.close()
    with pytest.raises(ModelNotFoundError, match=r"has no nope.gguf; it has \["):
        load(folder, gguf_file="nope.gguf")
    with mock.patch("huggingface_hub.hf_hub_download", return_value=str(ggufs["Q8_0"])) as download:
        engine = load("someone/starcoder2-GGUF", gguf_file="m.Q8_0.gguf", revision="abc123")
    download.assert_called_once_with("someone/starcoder2-GGUF", "m.Q8_0.gguf", revision="abc123")
    assert engine.name == "someone/starcoder2-GGUF/m.Q8_0.gguf"
    engine.close()
    from huggingface_hub.errors import LocalEntryNotFoundError

    with (
        mock.patch("huggingface_hub.hf_hub_download", side_effect=LocalEntryNotFoundError("offline")),
        pytest.raises(ModelNotFoundError, match="cannot be reached"),
    ):
        load("someone/starcoder2-GGUF", gguf_file="m.Q8_0.gguf")
    with pytest.raises(ModelNotFoundError, match="No GGUF file"):
        load(tmp_path / "missing.gguf")


def test_wrappers_take_gguf_file(ggufs: dict[str, Path]) -> None:
    from langchain_starcoder import ChatStarCoder
    from langchain_starcoder._registry import release_engines
    from langchain_starcoder.llama_index import StarCoder

    folder, name = str(ggufs["Q8_0"].parent), ggufs["Q8_0"].name
    llm = StarCoderLLM(model=folder, gguf_file=name, max_tokens=8)
    assert llm._identifying_params["gguf_file"] == name
    assert ChatStarCoder(model=folder, gguf_file=name).gguf_file == name
    assert StarCoder(model=folder, gguf_file=name).gguf_file == name
    with pytest.warns(GGUFNotice):
        text = llm.invoke(PROMPT)
    engine = llm.engine
    assert engine.path == ggufs["Q8_0"] and isinstance(text, str)
    assert StarCoderLLM(model=folder, gguf_file=name).engine is engine  # shared
    other = StarCoderLLM(model=str(ggufs["F32"]), max_tokens=8)  # a .gguf path as the model
    with pytest.warns(GGUFNotice):
        assert other.engine is not engine and other.engine.path == ggufs["F32"]
    assert StarCoderLLM(engine=engine, model=folder, gguf_file=name).engine is engine
    release_engines()


# --- bad input ---------------------------------------------------------------------------------------


def _edited(tiny_path: Path, tmp_path: Path, edit) -> Path:
    source = shutil.copytree(tiny_path, tmp_path / "edited")
    weights = dict(mx.load(str(source / "model.safetensors")))
    edit(weights)
    mx.save_safetensors(str(source / "model.safetensors"), weights, metadata={"format": "pt"})
    return write_gguf(source, tmp_path / "edited.gguf")


def _vocab_only(tiny_path: Path, tmp_path: Path) -> Path:
    writer = gguf.GGUFWriter(str(tmp_path / "vocab.gguf"), "starcoder")  # as ggml-vocab-starcoder.gguf
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tmp_path / "vocab.gguf"


def _other_architecture(tiny_path: Path, tmp_path: Path) -> Path:
    writer = gguf.GGUFWriter(str(tmp_path / "llama.gguf"), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tmp_path / "llama.gguf"


def _truncated(tiny_path: Path, tmp_path: Path) -> Path:
    data = write_gguf(tiny_path, tmp_path / "whole.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) - 1000])
    return tmp_path / "cut.gguf"


def _header_cut(tiny_path: Path, tmp_path: Path) -> Path:
    data = write_gguf(tiny_path, tmp_path / "whole.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:5000])  # inside the token list
    return tmp_path / "cut.gguf"


def _bad_merges(tiny_path: Path, tmp_path: Path) -> Path:
    source = shutil.copytree(tiny_path, tmp_path / "src")
    spec = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    merges = spec["model"]["merges"]
    merges.append("zzz qqq" if isinstance(merges[0], str) else ["zzz", "qqq"])
    (source / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    return write_gguf(source, tmp_path / "merges.gguf")


def _not_gguf(tiny_path: Path, tmp_path: Path) -> Path:
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04" + bytes(100))
    return tmp_path / "x.gguf"


BAD_FILES = {
    "architecture": (_other_architecture, UnsupportedModelError, "holds a 'llama' model"),
    "truncated": (_truncated, CheckpointError, "is truncated: its tensors need"),
    "header cut": (_header_cut, CheckpointError, "truncated or not a valid GGUF file"),
    "not gguf": (_not_gguf, CheckpointError, "is not a GGUF file"),
    "vocab only": (_vocab_only, CheckpointError, "holds no weights"),
    "bad merges": (_bad_merges, CheckpointError, "the tokenizer's merges do not fit its tokens"),
    "missing tensor": (
        lambda p, t: _edited(p, t, lambda w: w.pop("model.layers.1.mlp.c_fc.bias")),
        CheckpointError,
        "has no tensor blk.1.ffn_up.bias",
    ),
    "wrong shape": (
        lambda p, t: _edited(
            p, t, lambda w: w.update({"model.layers.0.self_attn.k_proj.weight": mx.zeros((64, 64))})
        ),
        CheckpointError,
        r"tensor blk.0.attn_k.weight has shape \[64, 64\], but the metadata .* implies \[32, 64\]",
    ),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_files_get_one_clear_error(
    case: str, tiny_path: Path, tmp_path: Path, ggufs: dict[str, Path]
) -> None:
    make, error, message = BAD_FILES[case]
    file = make(tiny_path, tmp_path)
    with pytest.raises(error, match=message) as info:
        load(file)
    assert isinstance(info.value, StarCoderError) and "\n" not in str(info.value)
    load(ggufs["Q8_0"]).close()  # the next load works


# --- convert -------------------------------------------------------------------------------------------


def test_convert_writes_an_mlx_checkpoint_that_stays_quantized(
    ggufs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = tmp_path / "converted"
    assert cli.main(["convert", str(ggufs["Q4_0"]), str(dst), "--sliding-window", str(WINDOW)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(dst) and "note:" not in err  # the window was given: no notice
    config = json.loads((dst / "config.json").read_text())
    assert config["quantization"]["bits"] == 4 and config["quantization"]["group_size"] == 32
    assert config["quantization"]["model.embed_tokens"] == {"group_size": 32, "bits": 8}
    assert config["sliding_window"] == WINDOW
    assert (dst / "tokenizer.json").is_file()
    # the packed weights are the file's, bit for bit
    written = mx.load(str(dst / "model.safetensors"))
    gguf_arrays = mx.load(str(ggufs["Q4_0"]))
    assert written["model.layers.0.mlp.c_fc.weight"].dtype == mx.uint32
    assert mx.array_equal(written["model.layers.0.mlp.c_fc.weight"], gguf_arrays["blk.0.ffn_up.weight"])
    # this package loads it (tokenizer.json included) and computes what the GGUF file computes
    ours, direct = StarCoderEngine.load(dst), load(ggufs["Q4_0"])
    ids = prompt_ids(32)
    assert np.abs(ours.logits(ids) - direct.logits(ids)).max() < 1e-5
    digits = "x = [\n    1,\n    22,\n]  16"  # spaces before digits: StarCoder's pre-tokenizer kept
    assert ours.encode(PROMPT) == direct.encode(PROMPT) and ours.encode(digits) == direct.encode(digits)
    ours.close()
    direct.close()
    # and so does mlx-lm's own loader
    from mlx_lm import load as mlx_lm_load

    model, tokenizer = mlx_lm_load(str(dst))
    assert isinstance(model.model.layers[0].mlp.c_fc, nn.QuantizedLinear)
    assert model.model.embed_tokens.bits == 8
    assert tokenizer.encode(PROMPT) == ours.encode(PROMPT) and tokenizer.encode(digits) == ours.encode(digits)
    assert set(tokenizer.all_special_tokens) >= set(SPECIAL_TOKENS)


def test_cli_runs_a_gguf_model(ggufs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    folder, name = ggufs["Q8_0"].parent, ggufs["Q8_0"].name
    argv = ["generate", "--prompt", PROMPT, "--max-tokens", "4", "--sliding-window", str(WINDOW)]
    assert cli.main([*argv, "--model", str(ggufs["Q8_0"])]) == 0
    by_path = capsys.readouterr().out
    assert cli.main([*argv[:-2], "--model", str(folder), "--gguf-file", name]) == 0
    out, err = capsys.readouterr()
    assert out == by_path != ""
    # the notice is one line on stderr, not a Python warning with its source line
    assert re.search(
        r"^langchain-starcoder: note: tiny-Q8_0.gguf does not record .*4096.*--sliding-window", err, re.M
    )
    assert cli.main(["convert", str(folder), str(folder.parent / "x")]) == 1
    assert "give a .gguf file" in capsys.readouterr().err


# --- StarCoder (v1, GPTBigCode): llama.cpp's "starcoder" architecture ---------------------------------


@pytest.fixture(scope="module")
def v1(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny StarCoder (multi-query, n_inner null, untied) and its GGUF files; "Q4_0" mixes in a
    Q8_0 token embedding. The position embedding stays F32, as llama.cpp's converter keeps it."""
    out = tmp_path_factory.mktemp("v1")
    files = {"source": build_gpt_bigcode(out / "src", seed=5)}
    files["F32"] = write_gguf(files["source"], out / "v1-F32.gguf")
    files["Q8_0"] = write_gguf(files["source"], out / "v1-Q8_0.gguf", ftype="Q8_0")
    files["Q4_0"] = write_gguf(
        files["source"], out / "v1-Q4_0.gguf", ftype="Q4_0", types={"token_embd": "Q8_0"}
    )
    return files


def test_v1_float32_gguf_matches_its_safetensors(v1: dict[str, Path]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", GGUFNotice)  # no window to assume: no notice
        engine = StarCoderEngine.load(v1["F32"])
    ref = StarCoderEngine.load(v1["source"])
    try:
        assert engine.backend.raw_config["model_type"] == "gpt_bigcode"
        assert engine.context_window == ref.context_window == 1024 and engine.sliding_window is None
        ids = prompt_ids(64)
        assert np.abs(engine.logits(ids) - ref.logits(ids)).max() < 1e-4
        ours, theirs = engine.generate(PROMPT, max_tokens=32), ref.generate(PROMPT, max_tokens=32)
        assert ours.token_ids == theirs.token_ids and ours.completion_tokens == 32
    finally:
        engine.close()
        ref.close()


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_0"])
def test_v1_quantized_gguf_matches_its_dequantized_weights(
    v1: dict[str, Path], tmp_path: Path, ftype: str
) -> None:
    engine = StarCoderEngine.load(v1[ftype])
    try:
        block = engine.backend.model.transformer.h[0]
        assert isinstance(block.attn.c_attn, nn.QuantizedLinear) and block.attn.c_attn.bits == int(ftype[1])
        assert isinstance(engine.backend.model.transformer.wte, nn.QuantizedEmbedding)
        assert type(engine.backend.model.transformer.wpe) is nn.Embedding  # F32 in the file
        ids = prompt_ids(48)
        ref = transformers_logits(dequantized_checkpoint(v1[ftype], v1["source"], tmp_path / "ref"), ids)
        assert np.abs(engine.logits(ids) - ref).max() < 1e-4
    finally:
        engine.close()


def test_v1_tokenizer_sliding_window_and_convert(v1: dict[str, Path], tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(v1["source"] / "tokenizer.json"))
    engine = StarCoderEngine.load(v1["Q8_0"])
    try:
        for text in corpus_lines()[:200]:
            assert engine.encode(text) == hf.encode(text, add_special_tokens=False).ids, text
        assert engine.token_id("<reponame>") == STARCODER_SPECIAL_TOKENS.index("<reponame>")
        assert STARCODER_SPECIAL_TOKENS.index("<filename>") not in engine.encode(
            "<filename>", special_tokens=False
        )
    finally:
        engine.close()
    with pytest.raises(InvalidParameterError, match="applies to StarCoder2"):
        StarCoderEngine.load(v1["F32"], sliding_window=16)
    dst = tmp_path / "converted"
    assert cli.main(["convert", str(v1["Q4_0"]), str(dst)]) == 0
    config = json.loads((dst / "config.json").read_text())
    assert config["model_type"] == "gpt_bigcode" and config["n_inner"] == 256
    ours, direct = StarCoderEngine.load(dst), StarCoderEngine.load(v1["Q4_0"])
    ids = prompt_ids(32)
    assert np.abs(ours.logits(ids) - direct.logits(ids)).max() < 1e-5
    ours.close()
    direct.close()
    from mlx_lm import load as mlx_lm_load

    model, _ = mlx_lm_load(str(dst))  # mlx-lm's own gpt_bigcode loads it (n_inner is written)
    assert isinstance(model.transformer.h[0].attn.c_attn, nn.QuantizedLinear)


def test_v1_multi_head_file_is_refused(tmp_path: Path) -> None:
    """llama.cpp's converter writes one KV head whatever the model has: a multi-head GPTBigCode's
    fused QKV then does not fit, and says so."""
    source = build_gpt_bigcode(tmp_path / "mha", multi_query=False)
    with pytest.raises(
        CheckpointError, match=r"blk.0.attn_qkv.weight has shape \[192, 64\].*implies \[96, 64\]"
    ):
        StarCoderEngine.load(write_gguf(source, tmp_path / "mha.gguf"))


# --- layout: one table of expected tensors ---------------------------------------------------------


def test_gguf_and_safetensors_expect_one_layout(tiny_path: Path) -> None:
    """What a GGUF file's metadata implies is, under our names (``our_name``, which loads its weights),
    exactly what the same config implies for safetensors, for every family, bias and tying."""
    starcoder2 = read_config(tiny_path)
    gpt_bigcode = {"model_type": "gpt_bigcode", **GPT_BIGCODE_PRESETS["tiny"]}
    configs = [
        starcoder2,
        {**starcoder2, "use_bias": False, "tie_word_embeddings": True},
        gpt_bigcode,
        {**gpt_bigcode, "tie_word_embeddings": False},
    ]
    for config in configs:
        arch = "starcoder" if config["model_type"] == "gpt_bigcode" else "starcoder2"
        theirs = expected_shapes(config)
        ours = {our_name(name, arch): shape for name, shape in theirs.items()}
        assert len(ours) == len(theirs) and None not in ours
        assert ours == expected_tensors(model_args(config))
    # multi-query: the fused QKV holds 64 query and 2 x 16 key/value rows; learned positions
    assert expected_shapes(gpt_bigcode)["blk.1.attn_qkv.bias"] == (96,)
    assert expected_shapes(gpt_bigcode)["position_embd.weight"] == (1024, 64)
    assert "blk.0.attn_q.bias" not in expected_shapes(configs[1])
