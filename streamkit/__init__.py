"""streamkit: real-time streaming AI pipelines."""

__version__ = "0.1.0"
