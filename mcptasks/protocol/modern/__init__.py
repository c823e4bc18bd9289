"""The 2026-07-28 era with the io.modelcontextprotocol/tasks extension."""
