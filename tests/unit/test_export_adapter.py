"""export-adapter: an mlx-lm adapter merged into the base (fused), in PEFT's layout and as llama.cpp's GGUF
adapter; the same logits everywhere (1e-4, float32), and bad input refused with what to do."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from safetensors.numpy import load_file

from langchain_starcoder.checkpoints.folders import DestinationError
from langchain_starcoder.errors import CheckpointError, ModelNotFoundError
from langchain_starcoder.finetune.export import fuse_adapter, to_gguf_lora, to_peft
from langchain_starcoder.loading import load_model
from langchain_starcoder.loading.adapter import apply_adapter, read_adapter
from langchain_starcoder.testing import build_starcoder2
from langchain_starcoder.testing.adapters import build_adapter

TOKENS = [5, 17, 300, 42, 901, 7, 64, 3]
KEYS = ["self_attn.q_proj", "self_attn.v_proj", "mlp.c_fc"]


def adapter(model: Path, out: Path, method: str = "lora", *, scale: float = 2.0, seed: int = 0) -> Path:
    """A random adapter of rank 4 on KEYS of both layers, strong enough to change the logits."""
    return build_adapter(model, out, method=method, rank=4, scale=scale, keys=KEYS, strength=0.2, seed=seed)


def mlx_logits(model_dir: Path, adapter_dir: Path | None = None) -> np.ndarray:
    """Logits of TOKENS on MLX in float32: the base, or the base with the adapter unfused."""
    loaded = load_model(model_dir, quantize=None, group_size=64, dtype="float32")
    if adapter_dir is not None:
        apply_adapter(loaded.model, loaded.args, read_adapter(adapter_dir), str(model_dir))
    return np.array(loaded.model(mx.array([TOKENS]))[0].astype(mx.float32))


@pytest.fixture(scope="module")
def lora(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return adapter(tiny_path, tmp_path_factory.mktemp("adapters") / "lora")


@pytest.fixture(scope="module")
def dora(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return adapter(tiny_path, tmp_path_factory.mktemp("adapters") / "dora", "dora", seed=1)


@pytest.mark.parametrize("kind", ["lora", "dora", "full"])
def test_the_fused_checkpoint_gives_the_unfused_logits(
    kind: str, tiny_path: Path, lora: Path, dora: Path, tmp_path: Path
) -> None:
    made = {"lora": lora, "dora": dora}.get(kind) or adapter(tiny_path, tmp_path / "full", "full")
    unfused = mlx_logits(tiny_path, made)
    assert np.abs(unfused - mlx_logits(tiny_path)).max() > 1e-2  # the adapter changes the model
    out = fuse_adapter(tiny_path, made, tmp_path / "fused")
    np.testing.assert_allclose(mlx_logits(out), unfused, atol=1e-4)
    assert (out / "tokenizer.json").is_file()
    assert "model.layers.0.self_attn.q_proj.weight" in load_file(str(out / "model.safetensors"))


def test_an_adapter_at_scale_zero_is_the_base(tiny_path: Path, tmp_path: Path) -> None:
    zero = adapter(tiny_path, tmp_path / "zero", scale=0.0)
    np.testing.assert_array_equal(mlx_logits(tiny_path, zero), mlx_logits(tiny_path))


def test_peft_layout_by_hand(lora: Path, tmp_path: Path) -> None:
    out = to_peft(lora, tmp_path / "peft")
    config = json.loads((out / "adapter_config.json").read_text(encoding="utf-8"))
    assert config["peft_type"] == "LORA"
    assert (config["r"], config["lora_alpha"]) == (4, 8.0)  # PEFT scales by alpha / r = mlx-lm's scale 2
    assert config["target_modules"] == ["c_fc", "q_proj", "v_proj"]
    assert (config["use_dora"], config["use_rslora"], config["layers_to_transform"]) == (False, False, [0, 1])
    tensors = load_file(str(out / "adapter_model.safetensors"))
    mlx = load_file(str(lora / "adapters.safetensors"))
    assert len(tensors) == len(mlx) == 12
    a = tensors["base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight"]
    b = tensors["base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"]
    assert (a.shape, b.shape) == ((4, 64), (32, 4))  # A (r, in), B (out, r)
    np.testing.assert_array_equal(a, mlx["model.layers.1.self_attn.v_proj.lora_a"].T)
    np.testing.assert_array_equal(b, mlx["model.layers.1.self_attn.v_proj.lora_b"].T)


@pytest.mark.parametrize("kind", ["lora", "dora"])
def test_peft_itself_loads_the_export_with_the_mlx_logits(
    kind: str, tiny_path: Path, lora: Path, dora: Path, tmp_path: Path
) -> None:
    peft = pytest.importorskip("peft")
    import torch
    from transformers import AutoModelForCausalLM

    made = lora if kind == "lora" else dora
    out = to_peft(made, tmp_path / "peft", model_dir=tiny_path)
    base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, out).eval()
    with torch.no_grad():
        logits = model(torch.tensor([TOKENS])).logits[0].numpy()
    np.testing.assert_allclose(logits, mlx_logits(tiny_path, made), atol=1e-4)


def test_the_gguf_adapter_has_llama_cpp_names_shapes_and_alpha(lora: Path, tmp_path: Path) -> None:
    import gguf

    out = to_gguf_lora(lora, tmp_path / "lora.gguf")
    reader = gguf.GGUFReader(out)
    assert reader.fields["general.type"].contents() == "adapter"
    assert reader.fields["general.architecture"].contents() == "starcoder2"
    assert reader.fields["adapter.type"].contents() == "lora"
    assert reader.fields["adapter.lora.alpha"].contents() == pytest.approx(8.0)
    shapes = {t.name: tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors}
    assert len(shapes) == 12
    assert shapes["blk.1.attn_v.weight.lora_a"] == (4, 64)  # numpy order: ggml's ne is (in, r)
    assert shapes["blk.1.attn_v.weight.lora_b"] == (32, 4)
    assert shapes["blk.0.ffn_up.weight.lora_b"] == (256, 4)
    mlx = load_file(str(lora / "adapters.safetensors"))
    b = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight.lora_b")
    want = mlx["model.layers.0.self_attn.q_proj.lora_b"].T
    np.testing.assert_array_equal(np.array(b.data).reshape(64, 4), want)


def test_an_adapter_for_another_base_names_both(tiny_path: Path, tmp_path: Path) -> None:
    wider = build_starcoder2(tmp_path / "small-base", preset="small")
    made = adapter(tiny_path, tmp_path / "for-tiny")
    with pytest.raises(CheckpointError, match=r"trained on another base \(.*tiny\) than .*small-base"):
        fuse_adapter(wider, made, tmp_path / "out")
    with pytest.raises(CheckpointError, match="another base"):
        to_peft(made, tmp_path / "peft", model_dir=wider)
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "peft").exists()


def test_a_damaged_adapter_file_is_named(tiny_path: Path, tmp_path: Path) -> None:
    made = adapter(tiny_path, tmp_path / "damaged")
    weights = made / "adapters.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    with pytest.raises(CheckpointError, match=r"adapters\.safetensors in .* is damaged"):
        fuse_adapter(tiny_path, made, tmp_path / "out")
    (made / "adapter_config.json").write_text("{", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"adapter_config\.json is not valid JSON"):
        to_peft(made, tmp_path / "peft")
    weights.unlink()
    with pytest.raises(ModelNotFoundError, match=r"has no adapters\.safetensors"):
        to_peft(made, tmp_path / "peft")
    with pytest.raises(ModelNotFoundError, match="nothing-here does not exist"):
        to_peft(tmp_path / "nothing-here", tmp_path / "peft")
    assert not (tmp_path / "out").exists()


def test_a_rank_that_disagrees_with_the_config_is_refused(tiny_path: Path, tmp_path: Path) -> None:
    made = adapter(tiny_path, tmp_path / "rank")
    config = json.loads((made / "adapter_config.json").read_text(encoding="utf-8"))
    config["lora_parameters"]["rank"] = 8
    (made / "adapter_config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(CheckpointError, match="says rank 8, but"):
        to_peft(made, tmp_path / "peft")


def test_an_out_folder_that_is_not_empty_is_kept(tiny_path: Path, lora: Path, tmp_path: Path) -> None:
    for out in (tmp_path / "fused", tmp_path / "peft"):
        out.mkdir()
        (out / "mine.txt").write_text("keep me", encoding="utf-8")
    with pytest.raises(DestinationError, match="already exists"):
        fuse_adapter(tiny_path, lora, tmp_path / "fused")
    with pytest.raises(DestinationError, match="already exists"):
        to_peft(lora, tmp_path / "peft")
    assert (tmp_path / "fused" / "mine.txt").read_text(encoding="utf-8") == "keep me"
    assert sorted(p.name for p in (tmp_path / "peft").iterdir()) == ["mine.txt"]


def test_a_full_fine_tune_has_no_peft_layout(tiny_path: Path, tmp_path: Path) -> None:
    made = adapter(tiny_path, tmp_path / "full", "full")
    with pytest.raises(ValueError, match=r"full fine-tune.*--fused"):
        to_peft(made, tmp_path / "peft")


def test_the_gguf_adapter_is_checked_against_the_base_gguf(
    tiny_path: Path, lora: Path, dora: Path, tmp_path: Path
) -> None:
    from langchain_starcoder.gguf_format import convert_to_gguf

    wider = convert_to_gguf(build_starcoder2(tmp_path / "small", preset="small"), tmp_path / "small.gguf")
    with pytest.raises(CheckpointError, match=r"trained on another base \(.*tiny\) than small\.gguf"):
        to_gguf_lora(lora, tmp_path / "a.gguf", base=wider)
    with pytest.raises(ValueError, match=r"DoRA adapter, which llama\.cpp cannot apply.*--fused"):
        to_gguf_lora(dora, tmp_path / "b.gguf")
    assert not (tmp_path / "a.gguf").exists()
    assert not (tmp_path / "b.gguf").exists()


def test_cached_gguf_adapters_are_named_by_the_adapters_bytes(tiny_path: Path, tmp_path: Path) -> None:
    from langchain_starcoder.gguf_format import convert_to_gguf
    from langchain_starcoder.gguf_format.lora import cached_adapter_gguf

    base = convert_to_gguf(tiny_path, tmp_path / "tiny.gguf", outtype="f32")
    made = adapter(tiny_path, tmp_path / "a")
    first = cached_adapter_gguf(read_adapter(made), base, tmp_path / "cache")
    assert cached_adapter_gguf(read_adapter(made), base, tmp_path / "cache") == first
    adapter(tiny_path, made, seed=1)  # retrained in place: another file, never the stale one
    second = cached_adapter_gguf(read_adapter(made), base, tmp_path / "cache")
    assert second != first
    assert second.read_bytes() != first.read_bytes()


def test_cli_export_adapter_writes_each_kind(
    tiny_path: Path, lora: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from langchain_starcoder import cli

    for flag, out in (
        ("--fused", tmp_path / "fused"),
        ("--peft", tmp_path / "peft"),
        ("--gguf", tmp_path / "a.gguf"),
    ):
        assert (
            cli.main(["export-adapter", "--model", str(tiny_path), "--adapter", str(lora), flag, str(out)])
            == 0
        )
        assert capsys.readouterr().out.strip() == str(out)
    np.testing.assert_allclose(mlx_logits(tmp_path / "fused"), mlx_logits(tiny_path, lora), atol=1e-4)
    assert (tmp_path / "peft" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "a.gguf").stat().st_size > 0


def test_cli_export_adapter_bad_input_is_said_and_keeps_everything(
    tiny_path: Path, lora: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from langchain_starcoder import cli

    wider = build_starcoder2(tmp_path / "small-base", preset="small")
    base = ["export-adapter", "--adapter", str(lora)]
    assert cli.main([*base, "--model", str(wider), "--gguf", str(tmp_path / "x.gguf")]) == 1
    err = capsys.readouterr().err
    assert "another base" in err and "small-base" in err and str(lora) in err
    existing = tmp_path / "taken.gguf"
    existing.write_bytes(b"mine")
    assert cli.main([*base, "--model", str(tiny_path), "--gguf", str(existing)]) == 1
    assert "already exists" in capsys.readouterr().err
    assert existing.read_bytes() == b"mine"
    assert cli.main([*base, "--model", str(tiny_path)]) == 2  # one of --fused, --peft, --gguf
    assert "one of the arguments --fused --peft --gguf is required" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()
