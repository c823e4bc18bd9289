"""The Channels notification fabric: publishing to groups and listening to
them (``mcptasks.notify.fabric``). It knows nothing of either protocol era."""
