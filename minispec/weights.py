"""`python -m minispec.weights [NAME]`: fetch and convert a known checkpoint (minispec.checkpoints.fetch)."""

import sys

from minispec.checkpoints.fetch import main

if __name__ == "__main__":
    sys.exit(main())
