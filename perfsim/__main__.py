import sys

from perfsim.cli import main

sys.exit(main())
