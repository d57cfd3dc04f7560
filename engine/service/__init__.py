"""The engine as a service: an HTTP server over one engine, and the client that talks to it.

`server` and the `routes_*` modules run in the engine's process (`specdeck-cli
serve`, or the private process the desktop app starts: `python -m
engine.service`); `client`, `process` and `wire` are light (no torch), for the
app and the CLI's `--server`.
"""
