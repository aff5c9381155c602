"""`python -m helpers.site`: `make html` (helpers/site/build.py)."""
import sys

from helpers.site.build import main

sys.exit(main())
