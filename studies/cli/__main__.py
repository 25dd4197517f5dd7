"""``python -m studies.cli``: the ``mae-study`` command."""

import sys

from . import main

sys.exit(main())
