"""``python -m quotientsharp``: the console script (also ``torchrun ... -m quotientsharp``)."""

import sys

from quotientsharp.cli import main

if __name__ == "__main__":
    sys.exit(main())
