"""`python -m minispec.generate`: the command line (minispec.generate)."""

import sys

from minispec.generate import main

sys.exit(main())
