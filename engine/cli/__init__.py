"""specdeck-cli: the engine from a terminal. `main.main` is the program; one module per command that needs more than a few lines."""
