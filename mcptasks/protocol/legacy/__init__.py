"""The 2025-11-25 era (and 2025-06-18, 2025-03-26): sessions, experimental
tasks, and the streams that carry server-to-client requests."""
