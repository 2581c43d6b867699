"""Built-in stages. Every module here is imported by the catalog (catalog.py), so modules import heavy
dependencies (models, torch) inside functions, not at module top level."""
