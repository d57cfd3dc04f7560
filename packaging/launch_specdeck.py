"""PyInstaller's entry script: app/__main__.py imports the package relatively, so start from here."""

from app.__main__ import main

raise SystemExit(main())
