"""Which config keys two runs differ in, from Hydra's record of each launch, and the warning for keys beyond the arms'
own switches. Hydra's file layout and format are checked once against a real ``@hydra.main`` app."""
from __future__ import annotations

import copy
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from omegaconf import OmegaConf

from recipe.report import cli, find_config, load_run, main, render_config_diff
from recipe.report.run_config import RunConfig, flatten

LOGGER_PATH = "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH"


def test_fair_pair_differs_only_in_the_arms_switches(runs_dir):
    base, capped = load_run(runs_dir / "baseline"), load_run(runs_dir / "capped")
    text = render_config_diff(base.config, capped.config, ("baseline", "capped"))
    assert text.splitlines() == [
        "## Config: capped vs baseline",
        "",
        f"- baseline: `{runs_dir / 'baseline/hydra/20250101T000000Z/.hydra/config.yaml'}` (last of 1 launch(es))",
        f"- capped: `{runs_dir / 'capped/hydra/20250101T060000Z/.hydra/config.yaml'}` (last of 2 launch(es))",
        "",
        "- actor_rollout_ref.rollout.enforce_eager: true -> false",
        '- data.sampler.class_path: null -> "pkg://recipe.adapter.sampler"',
        f'- {LOGGER_PATH}: "/ckpt/length_aware_grpo/baseline/logs/metrics.20250101T000000Z.jsonl" -> '
        '"/ckpt/length_aware_grpo/capped/logs/metrics.20250101T060000Z.jsonl"',
        '- ray_kwargs.ray_init.runtime_env.env_vars.WANDB_DIR: "/ckpt/length_aware_grpo/baseline" -> '
        '"/ckpt/length_aware_grpo/capped"',
        "- recipe.cap.enable: 0 -> 1",
        '- trainer.default_local_dir: "/ckpt/length_aware_grpo/baseline" -> "/ckpt/length_aware_grpo/capped"',
        '- trainer.experiment_name: "baseline" -> "capped"',
    ]
    # The resume changed total_epochs: a note on the run, and the last launch's value is the one compared.
    assert capped.config.values["trainer.total_epochs"] == 3
    assert any(n.startswith("launch config ") and "20250101T000000Z/.hydra/config.yaml differs from the last "
               "launch's in: trainer.total_epochs" in n for n in capped.notes)


def _config(inputs, experiment: str, **changes) -> RunConfig:
    values = flatten(inputs.launch_config(experiment, "20250101T000000Z", recipe=experiment != "base"))
    values.update(changes)
    return RunConfig(Path(f"{experiment}.yaml"), {k: v for k, v in values.items() if v != "<drop>"}, 1)


def test_differences_beyond_the_switches_are_warned_about(inputs):
    a = _config(inputs, "base")
    b = _config(
        inputs, "cand",
        **{"actor_rollout_ref.actor.optim.lr": 2e-6, "actor_rollout_ref.rollout.max_model_len": 20480,
           "data.shuffle": True, "data.seed": 1, "recipe.over_sample.enable": 1, "recipe.over_sample.ratio": 1.0,
           "actor_rollout_ref.rollout.n": "<drop>", LOGGER_PATH: "/tmp/metrics.jsonl"},
    )  # fmt: skip
    lines = render_config_diff(a, b, ("base", "cand")).splitlines()
    assert "- actor_rollout_ref.actor.optim.lr: 1e-06 -> 2e-06" in lines
    assert "- actor_rollout_ref.rollout.n: 16 -> <absent>" in lines
    assert "- data.seed: null -> 1" in lines and "- recipe.over_sample.ratio: <absent> -> 1.0" in lines
    assert lines.index("- actor_rollout_ref.actor.optim.lr: 1e-06 -> 2e-06") < lines.index("WARNING: " + (
        "actor_rollout_ref.actor.optim.lr differs beyond the arms' own switches: base 1e-06 -> cand 2e-06"))
    assert [line for line in lines if line.startswith("WARNING")] == [
        "WARNING: actor_rollout_ref.actor.optim.lr differs beyond the arms' own switches: base 1e-06 -> cand 2e-06",
        "WARNING: actor_rollout_ref.rollout.max_model_len differs beyond the arms' own switches: base <absent> -> "
        "cand 20480",
        "WARNING: actor_rollout_ref.rollout.n differs beyond the arms' own switches: base 16 -> cand <absent>",
        # A logger path outside the run's own directory is not a run path.
        f'WARNING: {LOGGER_PATH} differs beyond the arms\' own switches: base '
        '"/ckpt/length_aware_grpo/base/logs/metrics.20250101T000000Z.jsonl" -> cand "/tmp/metrics.jsonl"',
    ]


def test_values_compare_as_recorded(inputs):
    a = _config(inputs, "base", **{"actor_rollout_ref.rollout.n": 16, "trainer.val_before_train": True})
    b = _config(inputs, "base", **{"actor_rollout_ref.rollout.n": 16.0, "trainer.val_before_train": 1})
    assert [line for line in render_config_diff(a, b, ("a", "b")).splitlines() if line.startswith("- ")][2:] == [
        "- actor_rollout_ref.rollout.n: 16 -> 16.0",
        "- trainer.val_before_train: true -> 1",
    ]
    assert "- no differences" in render_config_diff(a, a, ("a", "a"))


def test_environment_reads_are_unknown_not_equal(inputs):
    env = "${oc.decode:${oc.env:SAMPLER_BUCKET_SIZE,1024}}"
    a = _config(inputs, "base", **{"data.sampler.bucket_size": env})
    b = _config(inputs, "cand", **{"data.sampler.bucket_size": env, "recipe.cap.mode": "${oc.env:MODE,seed}"})
    lines = render_config_diff(a, b, ("a", "b")).splitlines()
    assert not any(line.startswith("- data.sampler.bucket_size") for line in lines)  # same text: not a difference
    assert lines[-1] == (
        "WARNING: data.sampler.bucket_size, recipe.cap.mode: recorded as ${oc.env:...} reads of the launch "
        "environment, whose values Hydra does not record: whether they differ is unknown (launch through "
        "scripts/train_grpo.sh, which sets them explicitly)"
    )


def test_launches_are_ordered_by_stamp_not_mtime(tmp_path, inputs):
    run = tmp_path / "run"
    for i, stamp in enumerate(["20250101T000000Z-10", "20250101T000000Z-2", "20250101T000000Z"]):  # newest first
        inputs.write_launch_config(run, stamp, inputs.launch_config("run", stamp, recipe=True, total_epochs=10 - i))
    config, notes = find_config(run)
    assert config.file.parent.parent.name == "20250101T000000Z-10" and config.launches == 3
    assert [n.split("/hydra/")[1].split("/")[0] for n in notes] == ["20250101T000000Z", "20250101T000000Z-2"]
    assert find_config(run / "hydra" / "missing") == (None, []) and find_config(tmp_path / "none") == (None, [])


def test_cli_prints_the_diff_and_warning_before_the_table(runs_dir, tmp_path, inputs, monkeypatch, capsys):
    cand = tmp_path / "cand"
    shutil.copytree(runs_dir / "capped", cand)
    last = cand / "hydra" / "20250101T060000Z" / ".hydra" / "config.yaml"
    config = copy.deepcopy(inputs.launch_config("capped", "20250101T060000Z", recipe=True))
    config["actor_rollout_ref"]["rollout"]["max_num_seqs"] = 512
    last.write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "write_plots", lambda runs, out: (Path(out).mkdir(), {})[1])  # plots: test_report.py
    assert main([str(runs_dir / "baseline"), str(cand), "--out", "r"]) == 0
    out = capsys.readouterr().out
    key = "actor_rollout_ref.rollout.max_num_seqs"
    warning = f"WARNING: {key} differs beyond the arms' own switches: baseline 256 -> cand 512"
    assert out.startswith("## Config: cand vs baseline\n")
    assert out.index(f"- {key}: 256 -> 512") < out.index(warning) < out.index("| metric |")
    assert warning in (tmp_path / "r" / "compare.md").read_text()


def test_find_config_reads_what_hydra_writes(tmp_path):
    """A real @hydra.main app run the way train_grpo.sh runs recipe.main: hydra.run.dir=<run>/hydra/<stamp>."""
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent("""
        import hydra

        @hydra.main(config_path=".", config_name="c", version_base=None)
        def main(cfg):
            pass

        main()
    """))
    (tmp_path / "c.yaml").write_text("trainer:\n  total_epochs: 1\n  default_local_dir: /ckpt/x\n"
                                     "lr: 1.0e-06\nn: ${oc.env:N,16}\nref_n: ${n}\nlogger: [console, file]\n")
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, str(app), "trainer.total_epochs=3", "+recipe.cap.enable=1",
         f"hydra.run.dir={run / 'hydra' / '20250101T000000Z'}"],
        capture_output=True, text=True, timeout=120, env={"N": "8", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    config, notes = find_config(run)
    assert config.file == run / "hydra" / "20250101T000000Z" / ".hydra" / "config.yaml" and notes == []
    assert config.values == {
        "trainer.total_epochs": 3,
        "trainer.default_local_dir": "/ckpt/x",
        "lr": 1e-06,
        "n": "${oc.env:N,16}",  # unresolved: the launch's N=8 is not recorded
        "ref_n": "${n}",
        "logger": ["console", "file"],
        "recipe.cap.enable": 1,
    }
