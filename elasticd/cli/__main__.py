"""`python -m elasticd.cli`: the same front door as the `elasticd` script."""

from elasticd.cli.main import main

raise SystemExit(main())
