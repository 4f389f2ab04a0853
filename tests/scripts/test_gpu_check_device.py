"""``scripts/gpu_check.sh --fetch-wheels`` / ``--device``: the Megatron check sized for a lent GPU (no network, 64 MiB
carried per call). Its steps' CPU rehearsal is tests/megatron; here the script around them."""
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REQ = REPO / "requirements" / "device-megatron.txt"


def _section(section: str) -> list[str]:
    lines, inside = [], False
    for line in REQ.read_text().splitlines():
        if line.startswith("# --"):
            inside = line == f"# --{section}"
        elif inside and line and not line.startswith("#"):
            lines.append(line)
    return lines


def test_device_dry_run_installs_offline_over_the_machines_torch_then_runs_the_check(run_script, tmp_path):
    work = tmp_path / "w"
    r = run_script("gpu_check.sh", {"GPU_CHECK_WHEELS": str(tmp_path / "whl")}, "--device", "--dry-run", "--work",
                   str(work), gpus=0)
    assert r.returncode == 0, r.stderr
    steps = [shlex.split(line.split(": ", 1)[1]) for line in r.stdout.splitlines() if line.startswith("device: ")]
    assert "python" in steps[0][0] and steps[0][1:] == ["-m", "venv", "--system-site-packages", str(work / "venv")]
    for step, section in zip(steps[1:4], ("no-deps", "sdist", "with-deps")):
        assert step[:2] == [str(work / "venv" / "bin" / "python"), "-m"]
        assert {"--no-index", str(tmp_path / "whl")} <= set(step) and step[-len(_section(section)):] == \
            _section(section)
    assert "--no-deps" in steps[1] and "--no-deps" not in steps[3]
    assert steps[4][-7:] == ["-m", "recipe.megatron_check", "run", "--work", str(work / "check"), "--json",
                             str(work / "rows.json")]
    r3 = tmp_path / "whl" / "r3"
    assert steps[5][-13:] == ["-m", "recipe.megatron_check", "replay", "--work", str(work / "replay"), "--model",
                              str(r3 / "model"), "--rollouts", str(r3 / "rollouts.npz"), "--paths",
                              str(r3 / "paths.npz"), "--json", str(work / "replay-rows.json")]
    assert not work.exists()


def test_device_without_the_wheels_names_the_fetch(run_script, tmp_path):
    r = run_script("gpu_check.sh", {"GPU_CHECK_WHEELS": str(tmp_path / "none")}, "--device", "--work",
                   str(tmp_path / "w"), gpus=1)
    assert r.returncode == 2 and "is missing: run bash scripts/gpu_check.sh --fetch-wheels" in r.stderr


def test_device_without_the_recorded_routes_names_the_fetch(run_script, tmp_path):
    (tmp_path / "whl").mkdir()
    r = run_script("gpu_check.sh", {"GPU_CHECK_WHEELS": str(tmp_path / "whl")}, "--device", "--work",
                   str(tmp_path / "w"), gpus=1)
    assert r.returncode == 2 and "r3 (the routes the R3 step replays) is missing" in r.stderr
    assert "--fetch-wheels again" in r.stderr


def test_the_device_pins_are_the_gpu_stacks():
    gpu = (REPO / "requirements" / "gpu.txt").read_text()
    for pin in ("megatron-core==0.18.0", "transformers==5.9.0"):
        assert pin in _section("no-deps") + _section("with-deps") and re.search(f"^{re.escape(pin)}$", gpu, re.M)
    assert "megatron-bridge==0.5.1" in _section("no-deps") and \
        "megatron-bridge==0.5.1" in (REPO / "requirements" / "gpu-no-deps.txt").read_text()


@pytest.mark.network
def test_fetch_downloads_every_pin_within_what_a_device_call_carries(run_script, tmp_path):
    out = tmp_path / "whl"
    r = run_script("gpu_check.sh", {"GPU_CHECK_WHEELS": str(out)}, "--fetch-wheels", gpus=0, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    files = [p.name.lower().replace("-", "_") for p in out.iterdir() if p.is_file()]
    for pin in _section("no-deps") + _section("with-deps") + _section("sdist"):
        name, version = pin.lower().replace("-", "_").split("==")
        assert any(f.startswith(f"{name}_{version}") or f.startswith(f"{name}-{version}") for f in files), pin
    assert {p.name for p in (out / "r3").iterdir()} == {"model", "rollouts.npz", "paths.npz"}
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert size < 60 * 2**20, f"{size / 2**20:.1f} MiB"
    assert not list(tmp_path.glob("whl.tmp.*"))
