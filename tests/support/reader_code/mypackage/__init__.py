"""The reader's package of the docs' examples (a stand-in)."""
