import sys

from hetpart.cli import main

sys.exit(main())
