import sys

from fedjax_dro.cli import main

sys.exit(main())
