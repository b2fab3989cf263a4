"""``python -m langchain_starcoder.cli``, as before the command became a package."""

import sys

from . import main

sys.exit(main())
