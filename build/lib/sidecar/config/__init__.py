"""Settings, storage paths and the model table."""
