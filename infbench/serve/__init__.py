"""`infbench serve`: an OpenAI-compatible HTTP server over the continuous-batching engine.

protocol.py parses and validates requests and builds the response shapes, detokenize.py
turns token streams into text with stop strings, engine_loop.py runs the one engine in
its own thread, metrics.py renders Prometheus text, app.py wires the aiohttp routes.
"""
