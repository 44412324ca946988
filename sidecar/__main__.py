"""Allow ``python -m sidecar``."""

from sidecar.cli import main

raise SystemExit(main())
