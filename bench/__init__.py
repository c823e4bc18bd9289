"""The benchmark suite for mcptasks against fastmcp-tasks.

Run it from the repository root with ``python3 -m bench`` (``--quick`` for a
short pass). See docs/performance.md.
"""
