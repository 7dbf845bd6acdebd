import sys

from attncc.cli import main

sys.exit(main())
