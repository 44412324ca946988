"""What the sidecar knows about coding agents: where they keep their transcripts, and following those files."""
