"""The loop that claims due timers in batches and runs their handlers, and the safety-net scanner."""
