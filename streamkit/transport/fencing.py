"""One owner at a time for a session's remote stage, enforced by Redis itself.

A worker that takes a session's stage (first, or over from a worker it believes dead) acquires an
owner token `EPOCH:CONSUMER` in the session's hash `sk:{session}:own` (field: the stage), with an
epoch one above the last. Every write of that stage (XADD to its output edges) and every
acknowledgement (XACK of its inputs with its checkpoint) runs as a Lua script that first compares
the stored token with the worker's: a worker whose stage was taken over (it was paused past the
claim timeout, or cut off from Redis) gets `Fenced` on its next write or ack and stops, before it
writes or acknowledges anything more. Every key involved carries the `{session}` hash tag, so the
scripts stay in one Redis Cluster slot.
"""
from __future__ import annotations

from typing import Any

from streamkit.metrics import REGISTRY
from streamkit.transport.base import TransportClosed

FENCED = REGISTRY.counter("streamkit_worker_fenced_total",
                          "Writes or acks refused because the stage has a newer owner")
FENCE_ERROR = "FENCED"

_ACQUIRE = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local epoch = 1
if cur then epoch = tonumber(string.match(cur, '^(%d+):')) + 1 end
local token = epoch .. ':' .. ARGV[2]
redis.call('HSET', KEYS[1], ARGV[1], token)
return token
"""

# KEYS: own, stream. ARGV: stage, token, id, maxlen, data. 1 written, 0 already held (a replay).
_XADD = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return redis.error_reply('FENCED') end
local ok = redis.pcall('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], ARGV[3], 'f', ARGV[5])
if type(ok) == 'table' and ok.err then
  if string.find(ok.err, 'equal or smaller', 1, true) then return 0 end
  return ok
end
return 1
"""

# KEYS: own, ckpt, edge streams... ARGV: stage, token, checkpoint ('' for none), then per edge
# stream a count and that many entry ids.
_ACK = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return redis.error_reply('FENCED') end
local a = 4
for i = 3, #KEYS do
  local n = tonumber(ARGV[a])
  if n > 0 then redis.call('XACK', KEYS[i], 'g', unpack(ARGV, a + 1, a + n)) end
  a = a + n + 1
end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[2], ARGV[1], ARGV[3]) end
return 1
"""


# KEYS: own, edge streams... ARGV: stage, token, consumer, count. {1, streams} with what was read
# (XREADGROUP's reply), or {0, ids}: nothing new, and per stream the group's last-delivered id to
# wait after. Reading moves entries into the reader's pending list, so it is fenced too: a stale
# owner must not take entries the new owner would never see.
_READ = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return redis.error_reply('FENCED') end
local args = {'XREADGROUP', 'GROUP', 'g', ARGV[3], 'COUNT', ARGV[4], 'STREAMS'}
for i = 2, #KEYS do args[#args + 1] = KEYS[i] end
for i = 2, #KEYS do args[#args + 1] = '>' end
local res = redis.call(unpack(args))
if res then return {1, res} end
local last = {}
for i = 2, #KEYS do
  local id = '0-0'
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[i])) do
    local name, lid
    for j = 1, #g, 2 do
      if g[j] == 'name' then name = g[j + 1] elseif g[j] == 'last-delivered-id' then lid = g[j + 1] end
    end
    if name == 'g' then id = lid end
  end
  last[#last + 1] = id
end
return {0, last}
"""


class Fenced(TransportClosed):
    """This worker no longer owns the stage: another took the session over."""


def own_key(session: str) -> str:
    return f"sk:{{{session}}}:own"


class Fence:
    """The owner token of one worker for one stage of one session, and the fenced commands."""

    def __init__(self, r: Any, session: str, stage: str, token: str) -> None:
        self.r = r
        self.session = session
        self.stage = stage
        self.token = token
        self.key = own_key(session)
        self._xadd = r.register_script(_XADD)
        self._ack = r.register_script(_ACK)
        self._read = r.register_script(_READ)

    @classmethod
    async def acquire(cls, r: Any, session: str, stage: str, consumer: str) -> "Fence":
        token = await r.register_script(_ACQUIRE)(keys=[own_key(session)], args=[stage, consumer])
        return cls(r, session, stage, token.decode() if isinstance(token, bytes) else token)

    @property
    def epoch(self) -> int:
        return int(self.token.split(":", 1)[0])

    def fenced(self) -> Fenced:
        FENCED.inc(stage=self.stage)
        return Fenced(f"stage {self.stage!r} of session {self.session} has a newer owner than "
                      f"epoch {self.epoch}: this worker stops writing to it")

    async def still_owner(self) -> bool:
        cur = await self.r.hget(self.key, self.stage)
        return (cur.decode() if isinstance(cur, bytes) else cur) == self.token

    async def xadd(self, stream: str, entry_id: str, maxlen: int, data: bytes) -> bool:
        """True if written, False if Redis already held `entry_id` (a replay)."""
        try:
            return bool(await self._xadd(keys=[self.key, stream], args=[self.stage, self.token, entry_id, maxlen, data]))
        except Exception as exc:
            if FENCE_ERROR in str(exc):
                raise self.fenced() from None
            raise

    async def ack(self, ckpt: str, ids_by_stream: dict[str, list[str]], checkpoint: bytes | None) -> None:
        args: list[Any] = [self.stage, self.token, checkpoint or b""]
        for ids in ids_by_stream.values():
            args += [len(ids), *ids]
        try:
            await self._ack(keys=[self.key, ckpt, *ids_by_stream], args=args)
        except Exception as exc:
            if FENCE_ERROR in str(exc):
                raise self.fenced() from None
            raise

    async def read(self, streams: list[str], consumer: str, count: int) -> tuple[list[Any], dict[str, str]]:
        """New entries for `consumer` as [(stream, [(id, fields), ...]), ...]; when there are none,
        the id per stream after which new entries will come (to wait on with XREAD)."""
        try:
            found, payload = await self._read(keys=[self.key, *streams], args=[self.stage, self.token, consumer, count])
        except Exception as exc:
            if FENCE_ERROR in str(exc):
                raise self.fenced() from None
            raise
        if not found:
            return [], {k: (i.decode() if isinstance(i, bytes) else i) for k, i in zip(streams, payload, strict=True)}
        out = []
        for stream, entries in payload:
            parsed = [(eid, None if flat is None else dict(zip(flat[::2], flat[1::2], strict=True)))
                      for eid, flat in entries]
            out.append((stream.decode() if isinstance(stream, bytes) else stream, parsed))
        return out, {}
