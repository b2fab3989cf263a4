"""``python -m langchain_starcoder``: the ``langchain-starcoder`` command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
