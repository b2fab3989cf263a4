"""``finetune`` on the tiny checkpoint and a small repeated repository, through mlx-lm's trainer: the
held-out loss falls, the files (mlx-lm's adapter, finetune.json, loss.png), resume equals an
uninterrupted run, Ctrl-C and a full disk keep a loadable checkpoint, bad settings fail before loading."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.tuner.callbacks import TrainingCallback
from mlx_lm.tuner.utils import load_adapters

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.errors import CheckpointError, InvalidParameterError
from langchain_starcoder.finetune import checkpoints
from langchain_starcoder.finetune.train import finetune
from langchain_starcoder.loading import load_model

#: Small and fast: short examples, two to a batch, a checkpoint and a held-out loss every 3 steps.
FAST = {
    "steps": 6,
    "batch_size": 2,
    "learning_rate": 3e-3,
    "max_tokens": 96,
    "save_every": 3,
    "eval_every": 3,
    "held_out": 0.25,
}
FUNCTION = "def scale_{i}(value, factor={i}):\n    return value * factor + {i}\n\n\n"


def make_repo(root: Path) -> Path:
    """Eight files of the same idiom: what is learned on six holds on the two held out."""
    (root / "pkg").mkdir(parents=True)
    for k in range(8):
        text = "".join(FUNCTION.format(i=k * 3 + i) for i in range(3))
        (root / "pkg" / f"mod{k}.py").write_text(text)
    return root


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("finetune") / "repo")


@pytest.fixture(scope="module")
def trained(tiny_path: Path, repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One uninterrupted run, shared by the tests that read what it wrote."""
    out = tmp_path_factory.mktemp("run") / "adapter"
    return finetune(repo, model=tiny_path, out=out, **FAST)


def adapter_weights(out: Path) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in mx.load(str(out / "adapters.safetensors")).items()}


class StopAt(TrainingCallback):
    """Ctrl-C after step ``step`` (as a KeyboardInterrupt raised in the loop)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_loss_report(self, train_info: dict) -> None:
        if train_info["iteration"] == self.step:
            raise KeyboardInterrupt


def test_the_held_out_loss_falls_and_the_files_are_written(trained, tiny_path, repo):
    out = trained.out
    assert trained.held_out_loss_after < trained.held_out_loss_before - 1.0
    assert {"adapters.safetensors", "adapter_config.json", "finetune.json", "loss.png"} <= {
        p.name for p in out.iterdir()
    }
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no partial or scratch file left
    log = json.loads((out / "finetune.json").read_text())
    assert log["settings"]["method"] == "lora" and log["settings"]["rank"] == 8
    assert log["settings"]["steps"] == 6 and log["step"] == 6
    assert sorted(log["train_files"] + log["held_out_files"]) == [f"pkg/mod{k}.py" for k in range(8)]
    assert len(log["held_out_files"]) == 2 and not set(log["held_out_files"]) & set(log["train_files"])
    assert [r["step"] for r in log["losses"]] == [1, 2, 3, 4, 5, 6]
    assert all(np.isfinite(r["loss"]) for r in log["losses"])
    assert [r["step"] for r in log["held_out_losses"]] == [0, 3, 6]
    assert log["held_out_loss_before"] == log["held_out_losses"][0]["loss"] == trained.held_out_loss_before
    assert log["held_out_loss_after"] == log["held_out_losses"][-1]["loss"] == trained.held_out_loss_after
    assert log["trained_tokens"] > 0 and log["tokens_per_second"] > 0
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model"] == {
        "model_type": "starcoder2",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "vocab_size": 1024,
    }
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # mlx-lm reads the adapter: its layers on our model, and the adapter changes the logits.
    base = load_model(tiny_path, quantize=None, group_size=64, dtype="auto").model
    tuned = load_adapters(load_model(tiny_path, quantize=None, group_size=64, dtype="auto").model, str(out))
    tokens = mx.array([[5, 17, 200, 301, 42]])
    assert not np.allclose(np.array(base(tokens)), np.array(tuned(tokens)), atol=1e-3)
    # The engine serves it as mlx-lm applies it (its checks read the base in adapter_config.json).
    engine = StarCoderEngine.load(tiny_path, adapter_path=out)
    try:
        np.testing.assert_allclose(
            engine.logits([5, 17, 200, 301, 42]), np.array(tuned(tokens))[0], atol=1e-5
        )
    finally:
        engine.close()


def test_ctrl_c_keeps_a_loadable_checkpoint_and_resume_equals_an_uninterrupted_run(
    trained, tiny_path, repo, tmp_path
):
    out = tmp_path / "adapter"
    with pytest.raises(KeyboardInterrupt):
        finetune(repo, model=tiny_path, out=out, callback=StopAt(4), **FAST)
    state = checkpoints.load_checkpoint(out)
    assert state.step == 4  # Ctrl-C saved the step reached, past the checkpoint of step 3
    log = json.loads((out / "finetune.json").read_text())
    assert log["step"] == 4 and [r["step"] for r in log["losses"]] == [1, 2, 3, 4]
    load_adapters(load_model(tiny_path, quantize=None, group_size=64, dtype="auto").model, str(out))

    resumed = finetune(repo, model=tiny_path, out=out, resume=True, **FAST)
    assert resumed.steps == 6
    want, got = adapter_weights(trained.out), adapter_weights(out)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(
        [r["loss"] for r in resumed.losses], [r["loss"] for r in trained.losses], rtol=1e-5
    )
    assert resumed.held_out_loss_after == pytest.approx(trained.held_out_loss_after, rel=1e-5)


def test_a_disk_that_fills_during_a_checkpoint_keeps_the_previous_one(tiny_path, repo, tmp_path, monkeypatch):
    out = tmp_path / "adapter"
    real = checkpoints.save_arrays
    writes: list[Path] = []

    def fill_the_disk(path: Path, arrays: dict, metadata: dict | None = None) -> None:
        writes.append(path)
        if len(writes) == 3:  # the second checkpoint's state: half a file, then the disk is full
            Path(path).write_bytes(b"\x00" * 100)
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, arrays, metadata)

    monkeypatch.setattr(checkpoints, "save_arrays", fill_the_disk)
    with pytest.raises(CheckpointError, match=r"step 6.*No space left on device.*step 3 is kept"):
        finetune(repo, model=tiny_path, out=out, **{**FAST, "save_every": 3, "steps": 9})
    assert checkpoints.load_checkpoint(out).step == 3
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # the partial file is gone
    load_adapters(load_model(tiny_path, quantize=None, group_size=64, dtype="auto").model, str(out))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rank": 0}, "rank must be a positive integer"),
        ({"held_out": 1.5}, "held_out is the fraction of files"),
        ({"method": "qlora"}, "method must be one of lora, dora, full"),
        ({"steps": 0}, "steps must be a positive integer"),
        ({"fim_rate": -0.1}, "fim_rate is a share"),
        ({"eval_batches": 0}, "eval_batches must be a positive integer"),
        ({"num_layers": 0}, "num_layers must be a positive integer, or None for all"),
    ],
)
def test_bad_settings_fail_before_anything_loads(repo, tmp_path, change, message):
    # The model does not exist: an error about it would mean something loaded first.
    with pytest.raises(InvalidParameterError, match=message):
        finetune(repo, model=tmp_path / "no-model", out=tmp_path / "out", **{**FAST, **change})
    assert not (tmp_path / "out").exists()


def test_a_damaged_or_missing_checkpoint_and_a_finished_folder(trained, tiny_path, repo, tmp_path):
    with pytest.raises(CheckpointError, match="Nothing to resume"):
        finetune(repo, model=tiny_path, out=tmp_path / "empty", resume=True, **FAST)
    with pytest.raises(InvalidParameterError, match="--resume"):  # a run there: not overwritten
        finetune(repo, model=tiny_path, out=trained.out, **FAST)
    out = Path(shutil.copytree(trained.out, tmp_path / "copy"))
    with pytest.raises(CheckpointError, match="step 6, and steps=6: nothing to resume"):
        finetune(repo, model=tiny_path, out=out, resume=True, **FAST)
    with pytest.raises(CheckpointError, match=r"other settings \(rank=8 there, 4 now\)"):
        finetune(repo, model=tiny_path, out=out, resume=True, **{**FAST, "steps": 8, "rank": 4})
    state = out / "training_state.safetensors"
    state.write_bytes(state.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="is damaged"):
        finetune(repo, model=tiny_path, out=out, resume=True, **{**FAST, "steps": 8})


def test_num_layers_adapts_only_the_last_layers_and_the_engine_serves_it(trained, tiny_path, repo, tmp_path):
    few = {**FAST, "steps": 2, "save_every": 2, "eval_every": 2}
    last = finetune(repo, model=tiny_path, out=tmp_path / "last", num_layers=1, **few)
    names = set(mx.load(str(last.out / "adapters.safetensors")))
    assert names and all(n.startswith("model.layers.1.") for n in names)  # the tiny model has 2 layers
    assert json.loads((last.out / "adapter_config.json").read_text())["num_layers"] == 1
    assert json.loads((trained.out / "adapter_config.json").read_text())["num_layers"] == 2  # None: all
    engine = StarCoderEngine.load(tiny_path, adapter_path=last.out)
    try:
        tuned = load_adapters(
            load_model(tiny_path, quantize=None, group_size=64, dtype="auto").model, str(last.out)
        )
        np.testing.assert_allclose(
            engine.logits([5, 17, 200, 301, 42]),
            np.array(tuned(mx.array([[5, 17, 200, 301, 42]])))[0],
            atol=1e-5,
        )
    finally:
        engine.close()
    full = finetune(repo, model=tiny_path, out=tmp_path / "full", method="full", num_layers=1, **few)
    assert {n.split(".")[2] for n in mx.load(str(full.out / "adapters.safetensors"))} == {"1"}
    with pytest.raises(InvalidParameterError, match=r"num_layers=3, but .* has 2 layers: give at most 2"):
        finetune(repo, model=tiny_path, out=tmp_path / "three", num_layers=3, **few)
    assert not (tmp_path / "three").exists()  # a bad setting leaves nothing


def test_gradient_checkpointing_trains_the_same_and_leaves_the_layer_class_alone(
    trained, tiny_path, repo, tmp_path
):
    from langchain_starcoder.models.starcoder2 import TransformerBlock

    call = TransformerBlock.__call__
    checkpointed = finetune(repo, model=tiny_path, out=tmp_path / "ckpt", grad_checkpoint=True, **FAST)
    assert TransformerBlock.__call__ is call  # mlx-lm patches the class: restored for the engine's models
    np.testing.assert_allclose(
        [r["loss"] for r in checkpointed.losses], [r["loss"] for r in trained.losses], rtol=1e-4
    )
    assert json.loads((checkpointed.out / "finetune.json").read_text())["settings"]["grad_checkpoint"] is True


@pytest.fixture(scope="module")
def tiny_4bit(checkpoints: Path) -> Path:
    from langchain_starcoder.testing import build_starcoder2

    return build_starcoder2(checkpoints / "tiny-4bit", quantize=4)


def test_full_fine_tuning_and_qlora_write_adapters_mlx_lm_loads(tiny_path, tiny_4bit, repo, tmp_path):
    few = {**FAST, "steps": 2, "save_every": 2, "eval_every": 2}
    full = finetune(repo, model=tiny_path, out=tmp_path / "full", method="full", **few)
    weights = mx.load(str(full.out / "adapters.safetensors"))
    assert "model.layers.1.mlp.c_fc.weight" in weights and "model.embed_tokens.weight" not in weights
    base = dict(mx.load(str(tiny_path / "model.safetensors")))
    name = "model.layers.1.mlp.c_fc.weight"
    assert not np.allclose(np.array(weights[name]), np.array(base[name]))
    assert json.loads((full.out / "adapter_config.json").read_text())["fine_tune_type"] == "full"
    load_adapters(load_model(tiny_path, quantize=None, group_size=64, dtype="auto").model, str(full.out))

    qlora = finetune(repo, model=tiny_4bit, out=tmp_path / "qlora", **few)
    assert qlora.held_out_loss_after < qlora.held_out_loss_before
    names = set(mx.load(str(qlora.out / "adapters.safetensors")))
    assert names and all(n.endswith((".lora_a", ".lora_b")) for n in names)
    tuned = load_adapters(
        load_model(tiny_4bit, quantize=None, group_size=64, dtype="auto").model, str(qlora.out)
    )
    assert isinstance(
        tuned.layers[0].self_attn.q_proj.linear, nn.QuantizedLinear
    )  # QLoRA: the base stays 4-bit

    with pytest.raises(InvalidParameterError, match="is quantized: its weights cannot be trained"):
        finetune(repo, model=tiny_4bit, out=tmp_path / "full-4bit", method="full", **few)


def test_without_matplotlib_a_notice_and_no_picture(tmp_path, monkeypatch):
    import sys

    from langchain_starcoder.finetune.log import NoLossPlotNotice, plot_losses

    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if not installed
    with pytest.warns(NoLossPlotNotice, match=r"pip install 'langchain-starcoder\[finetune\]'"):
        assert plot_losses(tmp_path, [{"step": 1, "loss": 2.0}], [{"step": 0, "loss": 3.0}]) is None
    assert not list(tmp_path.iterdir())
