"""The client backend: `target:` scenarios measured against OpenAI-compatible servers.

sse.py parses the event stream incrementally, tokens.py turns streamed chunks into
per-token timestamps, openai_target.py runs a workload's requests on one asyncio loop into
the engine's RequestRecords, point.py builds a scenario point's result from them, and
mock_server.py is the known-schedule server the tests and the overhead benchmark use.
"""
