import sys

from minispec.testing.conform.report import main

sys.exit(main())
