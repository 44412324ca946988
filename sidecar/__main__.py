"""Allow ``python -m sidecar``."""

from sidecar.cli.main import main

raise SystemExit(main())
