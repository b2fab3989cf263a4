"""``serve``'s start (issue 38): its API keys, each a tenant (--api-key repeated, --api-key-file), what it
says when other machines reach it without a key, and a hub id it cannot have offline, said before it binds."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from langchain_starcoder import cli
from langchain_starcoder.cli import serve_checks

MISSING = "nobody-here/no-such-model"


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """The options serve hands create_app; serving stops there."""
    from langchain_starcoder import server

    options: dict[str, object] = {}

    def create_app(load: object, **given: object) -> object:
        options.update(given)
        raise KeyboardInterrupt

    monkeypatch.setattr(server, "create_app", create_app)
    monkeypatch.delenv(serve_checks.API_KEY_ENV, raising=False)
    return options


def test_keys_from_the_flag_repeated_and_from_a_file_each_a_tenant(capsys, seen, tiny_path, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# the team's keys\n\ncarol-key\n  dave-key  \n#erin-key\nalice-key\n")
    code, _, err = run(
        capsys,
        "serve",
        "--model",
        tiny_path,
        "--port",
        0,
        "--api-key",
        "alice-key",
        "--api-key",
        "bob-key",
        "--api-key-file",
        keys,
    )
    assert code != 0 and "interrupted" in err
    assert seen["api_key"] == ["alice-key", "bob-key", "carol-key", "dave-key"]
    assert not any(key in err for key in ("alice-key", "bob-key", "carol-key", "dave-key"))


def test_the_environment_key_when_no_flag_gives_one(capsys, seen, tiny_path, monkeypatch):
    monkeypatch.setenv(serve_checks.API_KEY_ENV, "from-env")
    run(capsys, "serve", "--model", tiny_path, "--port", 0)
    assert seen["api_key"] == ["from-env"]


@pytest.mark.parametrize(
    ("text", "said"),
    [("# only a comment\n\n", "holds no key"), (None, "cannot be read")],
    ids=["no key", "missing"],
)
def test_a_key_file_without_keys_or_unreadable_is_one_line(capsys, seen, tiny_path, tmp_path, text, said):
    keys = tmp_path / "keys"
    if text is not None:
        keys.write_text(text)
    code, _, err = run(capsys, "serve", "--model", tiny_path, "--port", 0, "--api-key-file", keys)
    assert code == 1 and said in err and len(err.strip().splitlines()) == 1
    assert seen == {}  # nothing served


def test_serve_help_says_that_without_a_key_the_server_has_one_tenant(capsys):
    code, out, _ = run(capsys, "serve", "--help")
    assert code == 0
    flat = " ".join(out.split())
    assert "without a key the server has one tenant" in flat and "--api-key-file" in flat


@pytest.mark.parametrize(
    ("host", "key", "warned"),
    [("0.0.0.0", None, True), ("0.0.0.0", "k", False), ("127.0.0.1", None, False)],
    ids=["every interface, no key", "every interface, a key", "loopback"],
)
def test_without_a_key_on_a_reachable_address_serve_says_what_clients_see(
    capsys, seen, tiny_path, host, key, warned
):
    flags = ["--api-key", key] if key else []
    _, _, err = run(capsys, "serve", "--model", tiny_path, "--host", host, "--port", 0, *flags)
    flat = " ".join(err.split())
    assert ("one tenant" in flat and "cached_tokens" in flat and "supersession" in flat) is warned, err
    assert "interrupted" in err  # it went on to serve all the same


def test_an_offline_hub_id_fails_before_binding_with_the_command_that_makes_a_local_checkpoint(tmp_path):
    """HF_HUB_OFFLINE=1 and an empty hub cache: serve says so at once, exit 1, before it takes its port
    (a port in use would otherwise be the error) and before any server starts."""
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
        env.pop(serve_checks.API_KEY_ENV, None)
        argv = ["serve", "--model", MISSING, "--port", str(port)]
        code = f"from langchain_starcoder.cli import main; raise SystemExit(main({argv!r}))"
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
        )
    assert result.returncode == 1, result.stderr
    assert "build-test-model" in result.stderr and "HF_HUB_OFFLINE" in result.stderr
    assert "in use" not in result.stderr and "Serving" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def _namespace(model: str, **more: object) -> argparse.Namespace:
    return argparse.Namespace(model=model, base_url=None, revision=None, gguf_file=None, **more)


def test_an_unreachable_hub_is_said_before_binding_too(monkeypatch, tmp_path):
    import httpx
    from huggingface_hub import HfApi, constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def unreachable(*args: object, **kwargs: object) -> None:
        raise httpx.ConnectError("no route to host")

    monkeypatch.setattr(HfApi, "model_info", unreachable)
    with pytest.raises(cli.CommandError, match=r"hub cannot be reached .*build-test-model"):
        serve_checks.check_model_reachable(_namespace(MISSING))


def test_a_cached_hub_id_a_folder_and_a_remote_name_pass(monkeypatch, tmp_path, tiny_path):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    cached = tmp_path / "models--someone--cached" / "snapshots" / ("a" * 40)
    cached.mkdir(parents=True)
    (cached / "config.json").write_text("{}")
    (tmp_path / "models--someone--cached" / "refs").mkdir()
    (tmp_path / "models--someone--cached" / "refs" / "main").write_text("a" * 40)
    serve_checks.check_model_reachable(_namespace("someone/cached"))
    serve_checks.check_model_reachable(_namespace(str(tiny_path)))
    serve_checks.check_model_reachable(argparse.Namespace(model=MISSING, base_url="http://127.0.0.1:1"))
    with pytest.raises(cli.CommandError, match="HF_HUB_OFFLINE"):
        serve_checks.check_model_reachable(_namespace(MISSING))


def test_serve_checks_keys_read_from_a_path(tmp_path: Path):
    keys = tmp_path / "k"
    keys.write_text("a\n#b\n\n c \n")
    assert serve_checks.read_key_file(keys) == ["a", "c"]


def test_serve_checks_use_loadings_hub_id_without_importing_mlx(tmp_path: Path):
    """serve's checks use the one ``is_hub_id`` (loading.hub's) and run before the model loads:
    neither they, ``serve --help`` nor ``loading.hub`` import MLX (``loading`` imports lazily)."""
    code = (
        "import json, sys\n"
        "from langchain_starcoder.cli import main, serve_checks\n"
        "from langchain_starcoder.loading import hub\n"
        "from langchain_starcoder.loading import is_hub_id\n"
        "help_code = main(['serve', '--help'])\n"
        "import argparse\n"
        "for model in (sys.argv[1], 'someone/model'):\n"
        "    args = argparse.Namespace(model=model, base_url=None, revision=None, gguf_file=None)\n"
        "    try:\n"
        "        serve_checks.check_model_reachable(args)\n"
        "    except Exception as e:\n"
        "        print(type(e).__name__, file=sys.stderr)\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm', 'transformers'))\n"
        "print(json.dumps({'help': help_code, 'heavy': heavy,\n"
        "    'same': serve_checks.is_hub_id is hub.is_hub_id is is_hub_id}))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {"help": 0, "heavy": [], "same": True}
    assert result.stderr.strip() == "CommandError"  # the hub id, offline and not cached: said, still light
