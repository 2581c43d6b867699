"""Benchmarks: `streamkit bench NAME` runs streamkit.bench.NAME.main(argv)."""
