import sys

from engine.service.run import main

sys.exit(main())
