"""The engine over the network: `streamkit worker --stage engine` (worker.py) serves generation
requests from Redis Streams, RemoteEngine (remote.py) sends them, wire.py is what they exchange."""
