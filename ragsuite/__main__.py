import sys

from ragsuite.cli import main

sys.exit(main())
