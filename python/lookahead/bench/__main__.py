import sys

from lookahead.bench import main

sys.exit(main())
