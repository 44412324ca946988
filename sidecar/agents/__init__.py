"""What the sidecar knows about coding agents: where they keep their transcripts and config files, following
those transcripts, and what ``setup`` writes into those configs (edited in place, every other byte kept)."""
