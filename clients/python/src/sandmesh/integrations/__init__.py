"""Adapters that plug sandmesh into agent frameworks as their own sandbox or executor type.

Each module imports its framework and is installed with the matching extra
(``pip install 'sandmesh[pydantic-ai]'``, ``[deepagents]``, ``[openai-agents]``,
``[smolagents]``); the core package never imports them. See README.md beside this file for
what each maps, what waits for a person, and what is not supported yet.
"""
