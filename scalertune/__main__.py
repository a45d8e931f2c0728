import sys

from scalertune.cli import main

sys.exit(main())
