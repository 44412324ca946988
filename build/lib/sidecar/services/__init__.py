"""The services the handlers call: the sidecar's state, the memory and context methods, compaction."""
