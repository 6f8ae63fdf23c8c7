"""Offline model preparation: AutoCompressor training (and other one-off fits)."""
