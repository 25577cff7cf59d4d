"""``python -m tl_geometry`` is the ``tl-geometry`` command line (and what ``torchrun -m tl_geometry`` starts)."""

import sys

from tl_geometry.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
