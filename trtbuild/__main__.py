import sys

from trtbuild.cli import main

sys.exit(main())
