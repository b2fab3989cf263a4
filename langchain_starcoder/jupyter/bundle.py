"""The prebuilt labextension: rebuild it from its TypeScript source, and tell whether it is up to date.

Users never build it (the wheel ships the bundle). After changing ``labextension/`` in a checkout, a
developer with Node.js runs::

    python -m langchain_starcoder.jupyter.bundle      # jlpm install, tsc, the JupyterLab builder, the stamp

The stamp (:data:`STAMP`, in the bundle) is a hash of the source the bundle was built from; a test
recomputes it from ``labextension/`` and fails when the committed bundle is older than its source.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from . import LABEXTENSION_DIR

#: The TypeScript project in a checkout of the repository (not in the wheel).
SOURCE_DIR = Path(__file__).resolve().parents[2] / "labextension"
#: What the bundle is built from: these files and everything under these folders.
SOURCE_FILES = ("package.json", "tsconfig.json", "yarn.lock", ".yarnrc.yml")
SOURCE_FOLDERS = ("src", "schema")
#: The file in the bundle that holds the hash of the source it was built from.
STAMP = "source-hash.txt"


def source_hash(source: Path = SOURCE_DIR) -> str:
    """A SHA-256 of the labextension's source files (paths and bytes, in a fixed order)."""
    files = [source / name for name in SOURCE_FILES]
    for folder in SOURCE_FOLDERS:
        files += [path for path in (source / folder).rglob("*") if path.is_file()]
    digest = hashlib.sha256()
    for path in sorted(files, key=lambda p: p.relative_to(source).as_posix()):
        digest.update(path.relative_to(source).as_posix().encode() + b"\0")
        digest.update(path.read_bytes().replace(b"\r\n", b"\n") + b"\0")  # a Windows checkout hashes alike
    return digest.hexdigest()


def bundle_stamp(bundle: Path = LABEXTENSION_DIR) -> str | None:
    """The source hash the bundle was built from (None: no bundle, or one built without the stamp)."""
    stamp = bundle / STAMP
    return stamp.read_text(encoding="utf-8").strip() if stamp.is_file() else None


def build(source: Path = SOURCE_DIR, bundle: Path = LABEXTENSION_DIR) -> None:
    """Install the npm dependencies, compile the TypeScript, bundle it with JupyterLab's builder into
    ``bundle`` (``jupyterlab.outputDir`` in package.json), then write the stamp."""
    jlpm = _tool("jlpm")
    subprocess.run([jlpm, "install"], cwd=source, check=True)
    subprocess.run([jlpm, "run", "build:lib"], cwd=source, check=True)
    # JupyterLab 4.6 moved its builder to jupyter-builder (which looks for the core's package.json
    # on npm unless told where the installed one is); before, `jupyter labextension build`.
    builder = _find("jupyter-builder")
    if builder is not None:
        import jupyterlab

        core = Path(jupyterlab.__file__).parent / "staging" / "package.json"
        command = [builder, "build", "--core-package-file", str(core), "."]
    else:
        command = [_tool("jupyter"), "labextension", "build", "."]
    subprocess.run(command, cwd=source, check=True)
    (bundle / STAMP).write_text(source_hash(source) + "\n", encoding="utf-8")


def _find(name: str) -> str | None:
    """A command of this Python's environment (its bin folder first, then PATH)."""
    return shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)


def _tool(name: str) -> str:
    found = _find(name)
    if found is None:
        msg = f"{name} was not found: install the jupyter extra (pip install -e '.[jupyter]') and Node.js 20."
        raise SystemExit(msg)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the bundle is up to date")
    args = parser.parse_args(argv)
    if args.check:
        fresh = bundle_stamp() == source_hash()
        print("The bundle is up to date." if fresh else "The bundle is out of date: rebuild it.")
        return 0 if fresh else 1
    build()
    print(f"Built {LABEXTENSION_DIR} (source {source_hash()[:12]}).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
