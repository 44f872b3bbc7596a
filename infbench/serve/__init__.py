"""`infbench serve`: an OpenAI-compatible HTTP server over the continuous-batching engine.

protocol.py parses and validates requests, responses.py builds the answers, detokenize.py
turns token streams into text with stop strings, engine_loop.py runs the one engine in
its own thread, metrics.py renders Prometheus text, app.py wires the aiohttp routes.
limits.py reads bodies within limits, security.py guards access and shapes errors,
runtime.py listens and shuts down, machine.py checks the size flags; router.py,
router_metrics.py and replicas.py are `--replicas`.
"""
