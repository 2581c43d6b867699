import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from streamkit.pipeline import PipelineError, default_pipelines_dir, load_pipeline, parse_pipeline

GOOD = """\
name: audio
input: {audio: {sample_rate: 16000}}
stages:
  - {name: rs, type: resample, sample_rate: 24000}
  - name: loud
    type: gain
    db: 6
  - {name: quiet, type: gain, db: -6, input: rs}
output: [loud, quiet]
"""


def issues(text: str):
    with pytest.raises(PipelineError) as info:
        parse_pipeline(textwrap.dedent(text))
    return info.value.issues


def test_good_pipeline_builds_a_fan_out_graph():
    spec = parse_pipeline(GOOD)
    assert spec.order() == ["rs", "loud", "quiet"]
    assert spec.inputs_of == {"rs": ["input"], "loud": ["rs"], "quiet": ["rs"]}
    assert sorted(spec.downstream_of("rs")) == ["loud", "quiet"]
    assert spec.stage("loud").db == 6


def test_typo_in_a_stage_key_names_stage_key_line_and_column():
    [issue] = issues("""\
        name: audio
        stages:
          - name: loud
            type: gain
            dbb: 6
        """)
    assert (issue.line, issue.column) == (5, 5)
    assert "stage 'loud'" in issue.message and "dbb" in issue.message


def test_bad_value_points_at_the_value():
    [issue] = issues("""\
        name: audio
        stages:
          - {name: rs, type: resample, sample_rate: fast}
        """)
    assert issue.line == 3 and issue.column == 45
    assert "sample_rate" in issue.message and "'fast'" in issue.message


def test_every_problem_is_reported_at_once():
    found = issues("""\
        name: audio
        stages:
          - {name: a, type: nosuch}
          - {name: b, type: gain, db: 500}
          - {name: c, type: gain, input: missing}
        output: [zzz]
        """)
    messages = [str(i) for i in found]
    assert len(found) == 4, messages
    assert "line 3, column 21: " in messages[0] and "unknown stage type 'nosuch'" in messages[0]
    assert messages[1].startswith("line 4, column 31") and "db" in messages[1]
    assert messages[2].startswith("line 5, column 34") and "'missing'" in messages[2]
    assert messages[3].startswith("line 6, column 10") and "'zzz'" in messages[3]


def test_duplicate_names_cycles_and_duplicate_keys():
    [dup] = issues("name: x\nstages:\n  - {name: a, type: gain}\n  - {name: a, type: gain}\n")
    assert dup.line == 4 and "used twice" in dup.message
    [cycle] = issues("name: x\nstages:\n  - {name: a, type: gain, input: b}\n  - {name: b, type: gain}\n")
    assert "cycle" in cycle.message
    [key] = issues("name: x\nname: y\nstages: [{name: a, type: gain}]\n")
    assert key.line == 2 and "duplicate key" in key.message


def test_yaml_syntax_error_and_unsafe_tags_are_errors_with_position():
    [syntax] = issues("name: x\nstages:\n  - {name: a, type: gain\n")
    assert syntax.line is not None and "YAML" in syntax.message
    [unsafe] = issues("name: !!python/object/apply:os.system ['echo hi']\nstages: [{name: a, type: gain}]\n")
    assert unsafe.line == 1 and "python/object" in unsafe.message


def test_cli_validate_reports_file_line_column_and_fails(tmp_path, streamkit_cmd):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: audio\nstages:\n  - {name: g, type: gain, gain: 3}\n")
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    result = subprocess.run([*streamkit_cmd, "validate", str(good), str(bad)], capture_output=True, text=True)
    assert result.returncode == 1
    assert f"{good}: ok" in result.stdout
    assert f"{bad}:3:27: stage 'g': unknown key 'gain'" in result.stderr


def test_shipped_pipelines_validate():
    files = sorted(Path(default_pipelines_dir()).glob("*.yaml"))
    for path in files:
        spec = load_pipeline(path)
        assert spec.name == path.stem


def test_operator_plugins_register_stage_types_only_when_named(tmp_path, streamkit_cmd):
    (tmp_path / "my_stages.py").write_text(
        "from typing import Literal\n"
        "from streamkit.stage import Stage, StageConfig, register_stage\n"
        "@register_stage('shout')\n"
        "class Shout(Stage):\n"
        "    class Config(StageConfig):\n"
        "        type: Literal['shout'] = 'shout'\n")
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text("name: p\nstages:\n  - {name: s, type: shout}\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    without = subprocess.run([*streamkit_cmd, "validate", str(pipeline)], capture_output=True, text=True, env=env)
    assert without.returncode == 1 and "unknown stage type 'shout'" in without.stderr
    with_plugin = subprocess.run([*streamkit_cmd, "validate", "--plugin", "my_stages", str(pipeline)],
                                 capture_output=True, text=True, env=env)
    assert with_plugin.returncode == 0 and "s(shout)" in with_plugin.stdout
