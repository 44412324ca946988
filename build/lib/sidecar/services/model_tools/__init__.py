"""Tools for the model: definitions to hand it, and ``memory/callTool`` to run the calls it makes."""
