"""Callbacks that connect PyTorch Lightning and the Hugging Face Trainer to elasticd (docs/integrations.md)."""
