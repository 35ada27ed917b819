"""``python -m launcher``: see launcher/cli.py."""
from launcher.cli import main

raise SystemExit(main())
