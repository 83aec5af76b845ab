"""``python -m testkit.rest_catalog fetch``: the REST catalog server's classpath, resolved once
(the Makefile's ``test-extended`` prerequisite)."""

import sys

from testkit.rest_catalog import main

sys.exit(main(sys.argv[1:]))
