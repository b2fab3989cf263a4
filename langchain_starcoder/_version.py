"""The installed distribution's version (a module of its own: the command line reads it without the package's
lazy names)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("langchain-starcoder")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
