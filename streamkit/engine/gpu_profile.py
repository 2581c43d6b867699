"""Where a CUDA decode step's time goes (run by scripts/gpu_check.sh after the self-test).

For each batch size B: the captured graph's replay time alone (CUDA events, the GPU's share of a
step), the same step run eagerly (kernel launches from Python), and the engine's own decode steps
at B concurrent streams (wall time of `EngineCore.step`: scheduling, input building, replay,
sampling, output). The engine step minus the replay is the host's share. Prints one JSON line.
"""
from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time

BATCHES = (1, 16, 64, 256, 512)
CONTEXT = 160  # tokens of KV each timed row attends over (about the bench's prompt + half its output)


def _replay_ms(runner, B: int, n: int = 50) -> tuple[float, float]:
    """Mean ms of one graph replay and of one eager decode_step, B rows over CONTEXT tokens."""
    import torch

    m = runner.model
    nb = -(-CONTEXT // m.kv_cache.block_size)
    runner.ids[:B] = 1
    runner.pos[:B] = CONTEXT - 1
    runner.bt[:B, :nb] = torch.arange(1, nb + 1, device=runner.bt.device)  # every row reads blocks 1..nb
    runner.slots[:B] = 0  # and writes its new K/V to the trash slot: cached prefixes stay intact
    runner.cl[:B] = CONTEXT
    g, _ = runner.graphs[B]
    args = (runner.ids[:B], runner.pos[:B], runner.slots[:B], runner.bt[:B], runner.cl[:B])
    out = []
    with torch.inference_mode():
        for body in (g.replay, lambda: m.decode_step(*args)):
            for _ in range(5):
                body()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(n):
                body()
            end.record()
            torch.cuda.synchronize()
            out.append(start.elapsed_time(end) / n)
    return out[0], out[1]


def _engine_steps_ms(eng, core, B: int, prompt_ids: list[list[int]], tokens: int = 48) -> tuple[float, int]:
    """p50 wall ms of the engine's pure decode steps while B streams generate."""
    from streamkit.engine import SamplingParams

    times: list[float] = []
    step = core.step

    def timed_step() -> None:
        t = time.perf_counter()
        step()
        if core.last_batch_size == B and not core.scheduler.waiting:
            times.append(time.perf_counter() - t)

    core.step = timed_step
    try:
        async def run() -> None:
            async def one(ids):
                async for _ in eng.generate_tokens(ids, SamplingParams(max_tokens=tokens), ignore_eos=True):
                    pass
            await asyncio.gather(*[one(prompt_ids[i % len(prompt_ids)]) for i in range(B)])

        asyncio.run(run())
    finally:
        del core.step
    # the first decode steps after the prefills still fill caches and allocators: skip a quarter
    kept = times[len(times) // 4:] or times
    return 1000 * statistics.median(kept), len(kept)


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"ok": False, "error": "CUDA not available"}))
        return 2
    from streamkit.engine import Engine, default_model_path
    from streamkit.engine.reference import PROMPTS, chat

    eng = Engine(default_model_path(), "cuda", max_num_seqs=max(BATCHES))
    core = eng.load()
    prompt_ids = [eng.encode(chat(p)) for p in PROMPTS]
    res: dict = {"device": torch.cuda.get_device_name(0), "context": CONTEXT, "batches": {}}
    for B in BATCHES:
        replay, eager = _replay_ms(core.graphs, B)
        step, n = _engine_steps_ms(eng, core, B, prompt_ids)
        res["batches"][B] = {"replay_ms": round(replay, 3), "eager_ms": round(eager, 3),
                             "engine_step_ms": round(step, 3), "steps_timed": n,
                             "host_ms": round(step - replay, 3), "tok_s_at_step": round(1000 * B / step, 1),
                             "tok_s_at_replay": round(1000 * B / replay, 1)}
        print(f"[gpu profile] B={B}: {res['batches'][B]}", file=sys.stderr, flush=True)
    eng.close()
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
