"""PyInstaller's entry script: app/__main__.py imports the package relatively, so start from here.

The frozen executable is also the window's engine process: started with ENGINE_FLAG first
(engine/service/process.py), it runs the engine server instead of a window.
"""

import sys

if sys.argv[1:2] == ["--specdeck-engine"]:
    from engine.service.run import main as engine_main

    raise SystemExit(engine_main(sys.argv[2:]))

from app.__main__ import main

raise SystemExit(main())
