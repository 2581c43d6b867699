"""Redis Streams protocol shared by the engine worker and RemoteEngine (msgpack payloads).

    {prefix}:requests         stream, consumer group "engine": {"d": {id, prompt, params, reply, model}}
                              (model: a GGUF path or packaged name; null: the worker's default)
    {prefix}:reply:{id}       per-request stream: {"d": {"k": "start"|"text"|"done"|"error", "v": ...,
                              "n": 0, 1, ...}}  (numbered: a client sees messages Redis lost)
    {prefix}:cancel           stream every worker tails: {"d": {id}}
    {prefix}:stats:{worker}   hash with the worker's engine stats (expires)
"""
from __future__ import annotations

import msgpack

DEFAULT_PREFIX = "streamkit:engine"
GROUP = "engine"
REPLY_TTL_S = 300


def requests_key(prefix: str) -> str:
    return f"{prefix}:requests"


def reply_key(prefix: str, rid: str) -> str:
    return f"{prefix}:reply:{rid}"


def cancel_key(prefix: str) -> str:
    return f"{prefix}:cancel"


def stats_key(prefix: str, worker: str) -> str:
    return f"{prefix}:stats:{worker}"


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes):
    return msgpack.unpackb(data, raw=False)
