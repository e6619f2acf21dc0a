"""The GitHub workflows: valid against the workflow schema, a timeout on every job, a concurrency
group on every workflow, every action pinned to a ref, and the scripts they run present.

check-jsonschema (installed by .ci/run) carries the schemas, so this runs offline; without it the
schema tests skip. actionlint runs where it is on PATH."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
IDS = [w.name for w in WORKFLOWS]


def check_jsonschema():
    exe = shutil.which("check-jsonschema")
    if exe:
        return [exe]
    try:
        import check_jsonschema  # noqa: F401
    except ImportError:
        pytest.skip("check-jsonschema is not installed (pip install check-jsonschema)")
    return [sys.executable, "-m", "check_jsonschema"]


def builtin_schemas(cmd):
    return set(re.findall(r"(?:vendor|custom)\.[a-z0-9-]+", subprocess.run(
        cmd + ["--help"], capture_output=True, text=True).stdout))


def load(path):
    try:
        from ruamel.yaml import YAML  # check-jsonschema's parser
    except ImportError:
        yaml = pytest.importorskip("yaml")
        return yaml.safe_load(path.read_text())
    return YAML(typ="safe").load(path.read_text())


def test_workflows_found():
    assert {"tests.yml", "wheels.yml"} <= set(IDS)


@pytest.mark.parametrize("schema", ["vendor.github-workflows", "custom.github-workflows-require-timeout"])
@pytest.mark.parametrize("workflow", WORKFLOWS, ids=IDS)
def test_schema(workflow, schema):
    """The SchemaStore workflow schema, and check-jsonschema's variant of it that requires
    timeout-minutes on every job."""
    cmd = check_jsonschema()
    if schema not in builtin_schemas(cmd):
        pytest.skip(f"this check-jsonschema has no builtin schema {schema}")
    run = subprocess.run(cmd + ["--builtin-schema", schema, str(workflow)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=IDS)
def test_timeouts_concurrency_pins(workflow):
    doc = load(workflow)
    assert "concurrency" in doc, f"{workflow.name}: no concurrency group"
    for name, job in doc["jobs"].items():
        assert isinstance(job.get("timeout-minutes"), int), f"{workflow.name}: job {name} has no timeout-minutes"
        for step in job.get("steps", []):
            uses = step.get("uses")
            if uses and not uses.startswith(("./", "docker://")):
                assert re.fullmatch(r"[\w.-]+/[\w./-]+@[\w./-]+", uses), f"{workflow.name}: {uses} is not pinned"
            for script in re.findall(r"\b(?:scripts|\.ci)/[\w./-]+", step.get("run", "")):
                assert (ROOT / script).exists(), f"{workflow.name}: runs {script}, which does not exist"


def test_no_extra_index_fallback():
    """torch for a CUDA variant comes from that variant's index alone: an extra index would
    silently give a torch of another CUDA version where the variant is missing."""
    text = (ROOT / ".github" / "workflows" / "wheels.yml").read_text() + (ROOT / "scripts" / "build_wheel.sh").read_text()
    assert "extra-index-url" not in text


def test_actionlint():
    exe = shutil.which("actionlint")
    if exe is None:
        pytest.skip("actionlint is not on PATH")
    run = subprocess.run([exe, "-no-color", *map(str, WORKFLOWS)], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
